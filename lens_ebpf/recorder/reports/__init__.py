"""The weekly GPU utilization report: its content from the recorder's own data
(content.py), its charts as inline SVG (charts.py), one self-contained HTML file and its PDF
(render.py), and where reports are kept and when they are made (weekly.py)."""
