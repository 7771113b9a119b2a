"""GPU accounting: the periodic allocation snapshots and pruning (jobs), each completed
hour's statistics (hours), and the reads the Statistics pages make (reads)."""
