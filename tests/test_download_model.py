"""download-model.sh end to end against the stand-in Hugging Face Hub on loopback; run: tests/run.sh tests/test_download_model.py.

The script's private venv is pointed (HF_VENV) at the test venv, which pins the same huggingface_hub 2.4.0, so no
test installs anything; HF_HOME points into the test's temp dir so no real token or cache is touched.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from standins.hf_hub import REPO_ID, HubStandin, tiny_repo

pytestmark = pytest.mark.slow  # runs download-model.sh end to end: a venv with pip, downloads from the Hub stand-in

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "download-model.sh"
STORAGE = "hub/models--" + REPO_ID.replace("/", "--")
SHARD = "model-00003-of-00007.safetensors"


def run(env, script=SCRIPT, args=()):
    return subprocess.run([str(script), *args], env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def hub():
    with HubStandin() as standin:
        yield standin


@pytest.fixture
def env(tmp_path, hub):
    return {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "MODEL_DIR": str(tmp_path / "models"),
            "HF_ENDPOINT": hub.url, "HF_VENV": sys.prefix, "HF_HOME": str(tmp_path / "hf-home"),
            "HF_HUB_DISABLE_TELEMETRY": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1"}


def snapshot(env, hub):
    return Path(env["MODEL_DIR"]) / STORAGE / "snapshots" / hub.commit


def assert_one_line_failure(result, *words):
    assert result.returncode != 0
    # The error is the last line; anything before it is the script's own progress notes, never a traceback.
    lines = result.stderr.strip().splitlines()
    assert lines and all(line.startswith("download-model.sh: ") for line in lines), result.stderr
    for word in words:
        assert word in lines[-1], lines[-1]


def assert_cache_matches(env, hub):
    for name, data in tiny_repo().items():
        assert (snapshot(env, hub) / name).read_bytes() == data, name
    assert (Path(env["MODEL_DIR"]) / STORAGE / "refs/main").read_text() == hub.commit


def test_help_prints_the_usage_header():
    result = run({"PATH": os.environ["PATH"]}, args=["-h"])
    assert result.returncode == 0
    assert result.stdout.startswith("Usage: ./download-model.sh") and "HF_TOKEN" in result.stdout


def test_unknown_argument_is_one_line():
    assert_one_line_failure(run({"PATH": os.environ["PATH"]}, args=["--bogus"]), "--bogus")


def test_first_run_downloads_second_is_a_noop_even_offline(env, hub):
    env["HF_TOKEN"] = "hf_test_token"
    first = run(env)
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip().splitlines()[-1].startswith(f"downloaded: {len(hub.files)} files, ")
    assert_cache_matches(env, hub)
    # HF_TOKEN reached the hub on every request the client made.
    assert {h.get("authorization") for _, p, h in hub.requests if REPO_ID in p} == {"Bearer hf_test_token"}

    fetched = len(hub.downloads())
    second = run(env)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == f"already cached: {len(hub.files)} files, 0.00 GiB in {Path(env['MODEL_DIR']) / STORAGE}"
    assert len(hub.downloads()) == fetched, "a cached file was downloaded again"

    hub.stop()
    offline = run(env)
    assert offline.returncode == 0, offline.stderr
    assert offline.stdout.startswith(f"already cached: {len(hub.files)} files") and "hub unreachable" in offline.stdout


def test_truncated_shard_is_detected_and_fetched_again(env, hub):
    assert run(env).returncode == 0
    shard = snapshot(env, hub) / SHARD
    blob = shard.resolve()
    blob.write_bytes(blob.read_bytes()[:1000])

    repaired = run(env)
    assert repaired.returncode == 0, repaired.stderr
    assert f"truncated: {SHARD} (1000 of {len(hub.files[SHARD])} bytes)" in repaired.stderr
    assert repaired.stdout.strip().splitlines()[-1].startswith("downloaded: ")
    assert [p for p in hub.downloads() if p.endswith(SHARD)][-1].endswith(SHARD)
    assert_cache_matches(env, hub)


def test_truncated_shard_with_the_hub_down_fails_clearly(env, hub):
    assert run(env).returncode == 0
    blob = (snapshot(env, hub) / SHARD).resolve()
    blob.write_bytes(blob.read_bytes()[:1000])
    hub.stop()
    assert_one_line_failure(run(env), "cannot reach the hub", f"{SHARD} has 1000 of", "incomplete")


def test_deleted_file_is_fetched_again(env, hub):
    assert run(env).returncode == 0
    (snapshot(env, hub) / "chat_template.jinja").unlink()
    again = run(env)
    assert again.returncode == 0, again.stderr
    assert_cache_matches(env, hub)


def test_dropped_connection_resumes_with_a_range_request(env, tmp_path):
    # The client writes whole 10 MiB chunks, so the shard must be big enough for one to land before the cut.
    files = tiny_repo()
    files[SHARD] = os.urandom(24 * 2**20)
    with HubStandin(files) as hub:
        env["HF_ENDPOINT"] = hub.url
        hub.cut_once.add(SHARD)
        result = run(env)
        assert result.returncode == 0, result.stderr
        ranges = [h.get("range") for m, p, h in hub.requests if m == "GET" and p.endswith(SHARD)]
    assert ranges[0] is None and ranges[-1].startswith("bytes=") and int(ranges[-1][6:-1]) > 0, ranges
    assert (snapshot(env, hub) / SHARD).read_bytes() == files[SHARD]


def test_unreachable_hub_and_empty_cache(env, hub):
    hub.stop()
    assert_one_line_failure(run(env), "cannot reach the hub", "no download record")


def test_not_enough_disk_space(env, hub):
    hub.advertised_sizes[SHARD] = 2**60  # an exbibyte: more than any test machine has free
    result = run(env)
    assert_one_line_failure(result, "not enough disk space")
    assert not hub.downloads(), "the check must come before any download"


def test_unknown_repository(env):
    env["MODEL_ID"] = "nobody/no-such-model"
    assert_one_line_failure(run(env), "nobody/no-such-model not found")


def test_unknown_revision(env):
    env["MODEL_REVISION"] = "v9"
    assert_one_line_failure(run(env), "no revision 'v9'")


def test_model_dir_not_writable(env, tmp_path):
    (tmp_path / "file").write_text("")
    env["MODEL_DIR"] = str(tmp_path / "file" / "models")
    assert_one_line_failure(run(env), "cannot create")


def test_model_dir_comes_from_dot_env_like_compose(env, hub, tmp_path):
    # A copy of the scripts with a .env beside them, as a user's checkout would have.
    copy = tmp_path / "checkout"
    (copy / "scripts").mkdir(parents=True)
    shutil.copy2(SCRIPT, copy / "download-model.sh")
    shutil.copy2(REPO / "scripts/download_model.py", copy / "scripts/download_model.py")
    (copy / "model").mkdir()
    shutil.copy2(REPO / "model/requirements.txt", copy / "model/requirements.txt")
    (copy / ".env").write_text(f"MAX_MODEL_LEN=131072\nMODEL_DIR={tmp_path / 'from-dot-env'}\n")
    del env["MODEL_DIR"]
    result = run(env, script=copy / "download-model.sh")
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "from-dot-env" / STORAGE / "refs/main").is_file()


def test_missing_python_is_one_line(env, tmp_path):
    # Only the tools the script itself needs, and no python3 among them.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "dirname", "sed", "tail", "tr", "cut"):
        (bin_dir / tool).symlink_to(shutil.which(tool))
    env["PATH"] = str(bin_dir)
    assert_one_line_failure(run(env), "python3 not found")


def test_client_install_failure_is_one_line(env, tmp_path):
    # A fresh venv location with the package index switched off: the install must fail, cleanly.
    env.update(HF_VENV=str(tmp_path / "new-venv"), PIP_NO_INDEX="1", PIP_FIND_LINKS="")
    result = run(env)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1].startswith(
        "download-model.sh: could not install huggingface_hub==2.4.0")
    assert (tmp_path / "new-venv/pip-install.log").is_file()
