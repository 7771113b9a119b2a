"""PyTorch profiler traces a pod's processes wrote, found in their containers' filesystems
(discovery.py) and served to the recorder (service.py)."""
