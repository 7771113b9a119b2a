"""PyTorch profiler traces of a workload's pods: found and fetched through their nodes'
agents (files.py), analysed by HolisticTraceAnalysis (analysis.py), and the TraceLens and
trace-viewer sessions over them (sessions.py)."""
