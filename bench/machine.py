"""The machine a benchmark's figures come from, for its JSON. `native_cpu_capability` is ATen's
CPU kernel set with ATEN_CPU_CAPABILITY unset: AVX2 and AVX-512 kernels round differently, so the
same inputs give other numbers under each (README, "Across hosts")."""
import os
import platform

import torch


def facts():
    cpu = [l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")][:1]
    return {
        "machine": platform.machine() + " " + str(os.cpu_count()) + " cpus",
        "cpu_model": cpu[0] if cpu else None,
        "native_cpu_capability": torch.backends.cpu.get_cpu_capability(),
    }
