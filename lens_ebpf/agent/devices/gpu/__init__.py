"""GPU collectors: AMD (amdsmi, amd-smi, sysfs) and NVIDIA (NVML, nvidia-smi)."""
