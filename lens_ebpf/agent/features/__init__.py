"""The agent's BPF programs and cluster sources as features (lens_ebpf/feature.py);
device collectors declare theirs in lens_ebpf/devices/."""
