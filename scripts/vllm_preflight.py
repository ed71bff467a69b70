"""Checks, in the vLLM image before vLLM's long boot, what would make it fail minutes later; the compose `preflight`
service runs it (`docker compose run --rm --no-deps preflight` runs it alone), with PREFLIGHT_DEVICE=gpu or cpu.

GPU: nvidia-smi answers (the toolkit passed the card in), the driver is new enough for the image's CUDA
(CUDA_VERSION, set by NVIDIA's base images), every visible card has GPU_MEMORY_UTILIZATION x its memory free.
CPU (the CPU trial): MemAvailable holds VLLM_CPU_KVCACHE_SPACE plus a floor for weights and runtime. Both:
/dev/shm is at least PREFLIGHT_MIN_SHM_MIB. Each problem is one line on stderr saying what to do; exit 1 if any.
Standard library only: it runs on the image's own python3, mounted read-only, with nothing installed.
"""
import os
import re
import shutil
import subprocess
import sys

PROG = "preflight"
# The oldest Linux driver each CUDA major release runs on: 13.0's own (its minimum, R580), and for 12.x the
# minor-version-compatibility floor (R525), which serves the cu129 image's precompiled kernels.
MIN_DRIVER = {13: "580.65.06", 12: "525.60.13"}
DEFAULT_CUDA = "13.0"  # vllm/vllm-openai:v0.32.0 is built for CUDA 13.0
QUERY = "index,name,driver_version,memory.total,memory.free"
MIB = 2**20
GIB = 2**30


def version_tuple(text):
    return tuple(int(part) for part in re.findall(r"\d+", text))


def parse_gpus(csv_text):
    """Rows of `nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits` as dicts (memory in MiB)."""
    gpus = []
    for line in csv_text.strip().splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5:
            raise ValueError(f"unexpected nvidia-smi line: {line!r}")
        index, name, driver, total, free = fields
        gpus.append({"index": index, "name": name, "driver": driver, "total_mib": int(total), "free_mib": int(free)})
    return gpus


def driver_problem(driver, cuda_version):
    major = version_tuple(cuda_version or DEFAULT_CUDA)[0]
    needed = MIN_DRIVER.get(major)
    if needed is None or version_tuple(driver) >= version_tuple(needed):
        return None
    fix = ("upgrade the NVIDIA driver to R580 or newer, or set VLLM_IMAGE=vllm/vllm-openai:v0.32.0-cu129 in .env"
           if major >= 13 else "upgrade the NVIDIA driver to R525 or newer")
    return f"driver {driver} is older than {needed}, which this image's CUDA {cuda_version or DEFAULT_CUDA} needs: {fix}"


def memory_problem(gpu, utilization):
    need = utilization * gpu["total_mib"]
    if gpu["free_mib"] >= need:
        return None
    fits = int(gpu["free_mib"] / gpu["total_mib"] * 100) / 100
    return (f"GPU {gpu['index']} ({gpu['name']}) has {gpu['free_mib'] / 1024:.1f} GiB free of "
            f"{gpu['total_mib'] / 1024:.1f} GiB, and GPU_MEMORY_UTILIZATION={utilization:g} needs {need / 1024:.1f} GiB: "
            f"stop what holds the card (see nvidia-smi on the host), or set GPU_MEMORY_UTILIZATION={fits:.2f} "
            f"and a lower MAX_MODEL_LEN in .env")


def shm_problem(shm_bytes, min_mib):
    if shm_bytes >= min_mib * MIB:
        return None
    return (f"/dev/shm is {shm_bytes / MIB:.0f} MiB, under the {min_mib} MiB vLLM's processes need to exchange "
            f"tensors: set VLLM_SHM_SIZE (default 16gb) in .env, or drop an shm_size override")


def cpu_memory_problem(available_bytes, kv_gib, floor_gib=1.0):
    need = (kv_gib + floor_gib) * GIB
    if available_bytes >= need:
        return None
    return (f"{available_bytes / GIB:.1f} GiB of memory available, under VLLM_CPU_KVCACHE_SPACE={kv_gib:g} GiB of KV "
            f"cache plus {floor_gib:g} GiB for vLLM itself: lower VLLM_CPU_KVCACHE_SPACE (and CPU_MAX_MODEL_LEN), "
            f"or close programs (the weights need their own room besides)")


def mem_available(meminfo_text):
    match = re.search(r"^MemAvailable:\s+(\d+) kB", meminfo_text, re.M)
    return int(match.group(1)) * 1024 if match else 0


def number(name, default):
    value = os.environ.get(name) or default
    try:
        return float(value)
    except ValueError:
        return None


def gpu_checks(problems, notes):
    utilization = number("GPU_MEMORY_UTILIZATION", "0.93")
    if utilization is None or not 0 < utilization <= 1:
        problems.append(f"GPU_MEMORY_UTILIZATION={os.environ.get('GPU_MEMORY_UTILIZATION')!r} is not a share "
                        f"between 0 and 1 (e.g. 0.93)")
        return
    if shutil.which("nvidia-smi") is None:
        problems.append("no nvidia-smi in the container, so no GPU was passed in: install the NVIDIA Container "
                        "Toolkit on the host, restart Docker, and check with "
                        "`docker run --rm --gpus all ubuntu nvidia-smi`")
        return
    try:
        proc = subprocess.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        problems.append("nvidia-smi did not answer within 60 s: the driver is hung; reboot the host or reload it")
        return
    if proc.returncode != 0:
        said = (proc.stdout + proc.stderr).strip().splitlines()
        problems.append(f"nvidia-smi failed ({said[0] if said else f'exit {proc.returncode}'}): "
                        f"fix the host's NVIDIA driver until `nvidia-smi` works there")
        return
    try:
        gpus = parse_gpus(proc.stdout)
    except ValueError as error:
        problems.append(f"could not read nvidia-smi's answer ({error}): run it on the host to see what is wrong")
        return
    if not gpus:
        problems.append("nvidia-smi lists no GPU: check VLLM_GPU in .env against `nvidia-smi -L` on the host")
        return
    cuda = os.environ.get("CUDA_VERSION") or DEFAULT_CUDA
    problem = driver_problem(gpus[0]["driver"], cuda)
    if problem:
        problems.append(problem)
    for gpu in gpus:
        problem = memory_problem(gpu, utilization)
        if problem:
            problems.append(problem)
        notes.append(f"GPU {gpu['index']} {gpu['name']}, driver {gpu['driver']} (CUDA {cuda}), "
                     f"{gpu['free_mib'] / 1024:.1f} of {gpu['total_mib'] / 1024:.1f} GiB free "
                     f"({utilization:g} needs {utilization * gpu['total_mib'] / 1024:.1f} GiB)")


def cpu_checks(problems, notes):
    kv = number("VLLM_CPU_KVCACHE_SPACE", "4")
    if kv is None or kv <= 0:
        problems.append(f"VLLM_CPU_KVCACHE_SPACE={os.environ.get('VLLM_CPU_KVCACHE_SPACE')!r} is not a size in GiB")
        return
    with open("/proc/meminfo") as f:
        available = mem_available(f.read())
    problem = cpu_memory_problem(available, kv)
    if problem:
        problems.append(problem)
    notes.append(f"CPU, {available / GIB:.1f} GiB available ({kv:g} GiB KV cache)")


def main():
    device = os.environ.get("PREFLIGHT_DEVICE") or "gpu"
    if device not in ("gpu", "cpu"):
        print(f"{PROG}: PREFLIGHT_DEVICE must be gpu or cpu, not {device!r}", file=sys.stderr)
        return 1
    problems: list[str] = []
    notes: list[str] = []
    (gpu_checks if device == "gpu" else cpu_checks)(problems, notes)
    min_shm = number("PREFLIGHT_MIN_SHM_MIB", "1024")
    stat = os.statvfs("/dev/shm")
    shm = stat.f_blocks * stat.f_frsize
    problem = shm_problem(shm, int(min_shm or 1024))
    if problem:
        problems.append(problem)
    notes.append(f"/dev/shm {shm / GIB:.1f} GiB")
    for problem in problems:
        print(f"{PROG}: {problem}", file=sys.stderr)
    if problems:
        return 1
    print(f"{PROG}: ok: {'; '.join(notes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
