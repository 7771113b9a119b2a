"""The deep dive into a pod, for the recorder: its processes (procs.py), py-spy against one
of them (pyspy.py), served as lens.v1.DeepDiveService (service.py)."""
