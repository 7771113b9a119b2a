"""The agent's BPF programs and cluster sources as features (agent/feature.py);
device collectors declare theirs in agent/devices/."""
