"""scripts/vllm_preflight.py's decisions, run as the preflight service runs it, with a stand-in nvidia-smi on PATH
(standins/nvidia_smi.py, the real tool's query output format); run: tests/run.sh tests/test_preflight.py.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts import vllm_preflight as pf

REPO = Path(__file__).resolve().parent.parent

A6000 = "NVIDIA RTX A6000"
IDLE = f"{A6000}|580.95.05|49140|573"          # what an idle A6000 with a desktop reports
BUSY = f"{A6000}|580.95.05|49140|19000"         # another process holds ~18.5 GiB


def run(tmp_path, gpus=IDLE, smi=True, **env):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    if smi:
        (bin_dir / "nvidia-smi").unlink(missing_ok=True)
        (bin_dir / "nvidia-smi").symlink_to(REPO / "standins/nvidia_smi.py")
    (bin_dir / "python3").unlink(missing_ok=True)
    (bin_dir / "python3").symlink_to(sys.executable)
    full = {"PATH": str(bin_dir), "FAKE_NVIDIA_SMI_GPUS": gpus, "PREFLIGHT_MIN_SHM_MIB": "1",
            "CUDA_VERSION": "13.0.1", **env}
    return subprocess.run([sys.executable, str(REPO / "scripts/vllm_preflight.py")], env=full,
                          capture_output=True, text=True, timeout=60)


def problems(result):
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert lines and all(line.startswith("preflight: ") for line in lines), result.stderr
    return lines


def test_the_stand_in_speaks_the_real_format():
    out = subprocess.run([str(REPO / "standins/nvidia_smi.py"), "--query-gpu=index,name,memory.total",
                          "--format=csv"], env={"FAKE_NVIDIA_SMI_GPUS": IDLE}, capture_output=True, text=True).stdout
    assert out == "index, name, memory.total [MiB]\n0, NVIDIA RTX A6000, 49140 MiB\n"


def test_an_idle_card_with_a_new_driver_passes(tmp_path):
    result = run(tmp_path, GPU_MEMORY_UTILIZATION="0.93")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("preflight: ok: GPU 0 NVIDIA RTX A6000, driver 580.95.05 (CUDA 13.0.1), "
                                    "47.4 of 48.0 GiB free (0.93 needs 44.6 GiB); /dev/shm "), result.stdout


def test_a_driver_too_old_for_cuda_13_names_both_ways_out(tmp_path):
    (line,) = problems(run(tmp_path, gpus=f"{A6000}|550.54.15|49140|573"))
    assert "driver 550.54.15 is older than 580.65.06" in line
    assert "R580" in line and "VLLM_IMAGE=vllm/vllm-openai:v0.32.0-cu129" in line


def test_the_same_driver_passes_with_the_cuda_12_image(tmp_path):
    assert run(tmp_path, gpus=f"{A6000}|550.54.15|49140|573", CUDA_VERSION="12.9.1").returncode == 0


def test_a_driver_too_old_even_for_cuda_12(tmp_path):
    (line,) = problems(run(tmp_path, gpus=f"{A6000}|470.256.02|49140|573", CUDA_VERSION="12.9.1"))
    assert "older than 525.60.13" in line and "R525" in line


def test_too_little_free_memory_says_what_would_fit(tmp_path):
    (line,) = problems(run(tmp_path, gpus=BUSY, GPU_MEMORY_UTILIZATION="0.93"))
    assert "GPU 0 (NVIDIA RTX A6000) has 29.4 GiB free of 48.0 GiB" in line
    assert "GPU_MEMORY_UTILIZATION=0.93 needs 44.6 GiB" in line
    assert "GPU_MEMORY_UTILIZATION=0.61" in line and "MAX_MODEL_LEN" in line


def test_a_lower_utilization_fits_the_busy_card(tmp_path):
    assert run(tmp_path, gpus=BUSY, GPU_MEMORY_UTILIZATION="0.6").returncode == 0


def test_every_visible_card_is_checked(tmp_path):
    (line,) = problems(run(tmp_path, gpus=f"{IDLE};{BUSY}"))
    assert line.startswith("preflight: GPU 1 ")


def test_several_problems_are_one_line_each(tmp_path):
    lines = problems(run(tmp_path, gpus=f"{A6000}|550.54.15|49140|19000", PREFLIGHT_MIN_SHM_MIB=str(10**9)))
    assert len(lines) == 3
    assert ["driver" in lines[0], "free of" in lines[1], "/dev/shm" in lines[2]] == [True] * 3


def test_no_nvidia_smi_means_no_gpu_was_passed_in(tmp_path):
    (line,) = problems(run(tmp_path, smi=False))
    assert "NVIDIA Container Toolkit" in line and "docker run --rm --gpus all" in line


def test_nvidia_smi_failing_is_quoted(tmp_path):
    (line,) = problems(run(tmp_path, FAKE_NVIDIA_SMI_FAIL="1"))
    assert "couldn't communicate with the NVIDIA driver" in line and "fix the host's NVIDIA driver" in line


def test_no_card_listed(tmp_path):
    (line,) = problems(run(tmp_path, gpus=""))
    assert "lists no GPU" in line and "VLLM_GPU" in line


@pytest.mark.parametrize("value", ["93", "0", "lots"])
def test_a_utilization_that_is_not_a_share(tmp_path, value):
    (line,) = problems(run(tmp_path, GPU_MEMORY_UTILIZATION=value))
    assert "is not a share between 0 and 1" in line


def test_small_shared_memory_names_the_variable(tmp_path):
    (line,) = problems(run(tmp_path, PREFLIGHT_MIN_SHM_MIB=str(10**9)))
    assert line.startswith("preflight: /dev/shm is ") and "VLLM_SHM_SIZE" in line


def test_cpu_mode_needs_no_card(tmp_path):
    result = run(tmp_path, smi=False, PREFLIGHT_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="0.001")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("preflight: ok: CPU, ") and "(0.001 GiB KV cache)" in result.stdout


def test_cpu_mode_with_a_kv_cache_bigger_than_memory(tmp_path):
    (line,) = problems(run(tmp_path, smi=False, PREFLIGHT_DEVICE="cpu", VLLM_CPU_KVCACHE_SPACE="100000"))
    assert "VLLM_CPU_KVCACHE_SPACE=100000 GiB" in line and "lower VLLM_CPU_KVCACHE_SPACE" in line


def test_an_unknown_device(tmp_path):
    (line,) = problems(run(tmp_path, PREFLIGHT_DEVICE="tpu"))
    assert "must be gpu or cpu" in line


# The decisions themselves, at their edges.

def test_driver_thresholds():
    assert pf.driver_problem("580.65.06", "13.0") is None
    assert pf.driver_problem("580.65.05", "13.0")
    assert pf.driver_problem("575.57.08", "13.0.1")
    assert pf.driver_problem("525.60.13", "12.9") is None
    assert pf.driver_problem("590.44.01", "") is None  # no CUDA_VERSION: the pinned image's 13.0


def test_memory_threshold_is_inclusive():
    gpu = {"index": "0", "name": "x", "total_mib": 1000, "free_mib": 930}
    assert pf.memory_problem(gpu, 0.93) is None
    assert pf.memory_problem({**gpu, "free_mib": 929}, 0.93)


def test_parse_gpus_rejects_a_line_it_does_not_know():
    with pytest.raises(ValueError):
        pf.parse_gpus("0, NVIDIA RTX A6000, 580.95.05\n")


def test_mem_available_reads_proc_meminfo():
    assert pf.mem_available("MemTotal:       24576000 kB\nMemAvailable:   12288000 kB\n") == 12288000 * 1024
    assert pf.mem_available("MemTotal: 1 kB\n") == 0


def test_the_script_needs_only_the_standard_library():
    # It runs on the vLLM image's python3 with nothing installed: every import is a standard module.
    text = (REPO / "scripts/vllm_preflight.py").read_text()
    imported = {line.split()[1].split(".")[0] for line in text.splitlines() if line.startswith(("import ", "from "))}
    assert imported <= set(sys.stdlib_module_names), imported - set(sys.stdlib_module_names)


def test_shutil_which_finds_the_stand_in(tmp_path):
    # Guards the tests above: the stand-in is what the script runs, not something else on the machine.
    run(tmp_path)
    assert shutil.which("nvidia-smi", path=str(tmp_path / "bin")) == str(tmp_path / "bin" / "nvidia-smi")
    assert os.access(REPO / "standins/nvidia_smi.py", os.X_OK)
