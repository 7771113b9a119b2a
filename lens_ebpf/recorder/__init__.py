"""`lens-ebpf recorder`: GPU pods and the workloads that own them, kept in a database."""
