"""GPU accounting: allocation snapshots and each completed hour's statistics (hours), and
the reads the Statistics pages make (reads)."""
