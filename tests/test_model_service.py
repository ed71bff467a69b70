"""The compose `model` service's image and the download's progress, disk and access decisions; run:
tests/run.sh tests/test_model_service.py. (The service itself runs in the container tier, tests/container.)

The image must run the code download-model.sh runs, with the same client: model/requirements.txt pins the
huggingface_hub download-model.sh installs, every pin hashed and equal to the test lock's, so these tests and
tests/test_download_model.py exercise exactly the packages the image holds.
"""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import download_model as dm
from standins.hf_hub import HubStandin

REPO = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.slow  # runs the model service's script against the Hub stand-in: downloads, progress intervals

LOCK = REPO / "model" / "requirements.txt"


def pins(path):
    return {m[1].lower().replace("_", "-"): m[2] for m in re.finditer(r"^([A-Za-z0-9_.-]+)==([^\s;]+)", path.read_text(), re.M)}


def test_the_image_pins_the_client_download_model_sh_installs():
    script = (REPO / "download-model.sh").read_text()
    (version,) = re.findall(r"^HF_HUB_VERSION=(\S+)$", script, re.M)
    assert pins(LOCK)["huggingface-hub"] == version
    assert f"huggingface_hub=={version}" in (REPO / "model" / "requirements.in").read_text()


def test_every_pin_of_the_image_is_hashed_and_the_tests_run_the_same():
    text = LOCK.read_text()
    tests = pins(REPO / "tests" / "requirements.txt")
    for name, version in pins(LOCK).items():
        block = re.search(rf"^{re.escape(name)}=={re.escape(version)}.*?(?=^\S|\Z)", text, re.M | re.S | re.I).group(0)
        assert "--hash=sha256:" in block, name
        assert tests.get(name) == version, f"{name}: model lock {version}, test lock {tests.get(name)}"


@pytest.mark.parametrize("pattern", [
    r"^FROM python:3\.11-slim$",
    r"^COPY model/requirements\.txt \./$",
    r"^RUN pip install --no-cache-dir --no-deps --require-hashes -r requirements\.txt && pip check$",
    r"^COPY scripts/download_model\.py \./$",
    r"^\s+PYTHONUNBUFFERED=1",
    r"^\s+HF_HUB_DISABLE_PROGRESS_BARS=1",
    r"^\s+DOWNLOAD_PROG=model$",
    r'^CMD \["python", "/app/download_model\.py"\]$',
])
def test_dockerfile(pattern):
    assert re.search(pattern, (REPO / "model" / "Dockerfile").read_text(), re.M)


def test_both_images_start_from_the_same_base():
    base = {re.search(r"^FROM (\S+)$", (REPO / d).read_text(), re.M)[1] for d in ("Dockerfile", "model/Dockerfile")}
    assert base == {"python:3.11-slim"}


# Progress lines: what `docker compose logs -f model` shows.

def test_progress_line_with_rate_and_eta():
    line = dm.progress_line(3, 12, 5 * 2**30, 20 * 2**30, 2**30, 10.0)
    assert line == "3/12 files, 5.00 GiB of 20.00 GiB (25%), 102.4 MiB/s, ETA 2m30s"


def test_progress_line_before_any_byte_arrived():
    assert dm.progress_line(0, 12, 0, 2**30, 0, 3.0) == "0/12 files, 0.00 GiB of 1.00 GiB (0%), waiting for data"


def test_progress_line_when_already_complete_has_no_negative_eta():
    assert dm.progress_line(2, 2, 100, 100, 100, 1.0).endswith("ETA 0s")


@pytest.mark.parametrize("seconds,text", [(0, "0s"), (59.4, "59s"), (60, "1m00s"), (3599, "59m59s"),
                                          (3600, "1h00m"), (7 * 3600 + 125, "7h02m")])
def test_duration_text(seconds, text):
    assert dm.duration_text(seconds) == text


def test_enough_disk_counts_the_headroom():
    assert dm.enough_disk(10, 20, headroom=10) is None
    problem = dm.enough_disk(10 * 2**30, 10 * 2**30, headroom=2**29)
    assert problem == "10.00 GiB to download (+0.50 GiB headroom), 10.00 GiB free: free 0.50 GiB or point MODEL_DIR at a bigger disk"


# The same script end to end, as the model image runs it (DOWNLOAD_PROG=model, not a terminal).

@pytest.fixture
def hub():
    with HubStandin() as standin:
        yield standin


def run(tmp_path, hub, **env):
    full = {"PATH": os.environ["PATH"], "HOME": str(tmp_path / "home"), "MODEL_DIR": str(tmp_path / "models"),
            "HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf-home"), "HF_HUB_DISABLE_TELEMETRY": "1",
            "DOWNLOAD_PROG": "model", **env}
    return subprocess.run([sys.executable, str(REPO / "scripts/download_model.py")], env=full,
                          capture_output=True, text=True, timeout=120)


def test_progress_lines_are_printed_and_no_bar_when_not_a_terminal(tmp_path, hub):
    result = run(tmp_path, hub, PROGRESS_INTERVAL="0.01")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.strip().splitlines()
    assert all(line.startswith("model: ") for line in lines), result.stderr
    assert lines[-1].startswith(f"model: {len(hub.files)}/{len(hub.files)} files, 0.00 GiB of 0.00 GiB (100%)")
    assert "\r" not in result.stderr  # no progress bar redrawing a line


def test_progress_is_off_with_zero(tmp_path, hub):
    result = run(tmp_path, hub, PROGRESS_INTERVAL="0", HF_HUB_DISABLE_PROGRESS_BARS="1")
    assert result.returncode == 0, result.stderr
    assert not re.search(r"\d+/\d+ files", result.stderr), result.stderr


def test_progress_interval_must_be_a_number(tmp_path, hub):
    result = run(tmp_path, hub, PROGRESS_INTERVAL="soon")
    assert result.returncode == 1 and result.stderr.strip() == (
        "model: PROGRESS_INTERVAL must be a number of seconds, not 'soon'")


def one_line(result):
    assert result.returncode == 1, result
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("model: "), line
    return line


def test_gated_repo_without_access(tmp_path, hub):
    hub.deny = (403, "GatedRepo", "Access to model is restricted and you are not in the authorized list.")
    line = one_line(run(tmp_path, hub))
    assert "is gated: accept its terms on the hub, then set HF_TOKEN" in line


def test_gated_repo_anonymously(tmp_path, hub):
    hub.deny = (401, "GatedRepo", "Access to model is restricted. You must have access to it and be authenticated.")
    assert "is gated" in one_line(run(tmp_path, hub))


def test_a_token_the_hub_does_not_know(tmp_path, hub):
    hub.deny = (401, None, "Invalid credentials in Authorization header")
    line = one_line(run(tmp_path, hub, HF_TOKEN="hf_revoked"))
    assert "refused access" in line and "HTTP 401" in line and "check HF_TOKEN" in line


def test_forbidden(tmp_path, hub):
    hub.deny = (403, None, "Forbidden")
    assert "(HTTP 403): check HF_TOKEN" in one_line(run(tmp_path, hub))


def test_no_network_says_what_to_check(tmp_path, hub):
    hub.stop()
    line = one_line(run(tmp_path, hub))
    assert "cannot reach the hub" in line and "check the network" in line


def test_not_enough_disk_says_how_much_to_free(tmp_path, hub):
    hub.advertised_sizes["config.json"] = 2**60
    line = one_line(run(tmp_path, hub))
    assert "not enough disk space" in line and "point MODEL_DIR at a bigger disk" in line
    assert not hub.downloads()
