"""plot_trace.py TRACE.json OUT.png [TITLE]: draws a --trace timeline as a PNG (one lane per device and
stream, one bar per task, coloured by micro-batch stage) for pages that cannot embed Perfetto.
Needs Debian's python3-matplotlib: /usr/bin/python3 chapters/model_parallel/plot_trace.py step.json t.png"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

trace, out = sys.argv[1], sys.argv[2]
events = json.load(open(trace, encoding="utf-8"))["traceEvents"]
devices = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
streams = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
tasks = [e for e in events if e.get("ph") == "X"]
t0 = min(e["ts"] for e in tasks)
lanes = sorted({(e["pid"], e["tid"]) for e in tasks})
labels = sorted({e["name"] for e in tasks})
colours = {name: plt.cm.tab20(i % 20) for i, name in enumerate(labels)}
fig, ax = plt.subplots(figsize=(11, 0.7 * len(lanes) + 1.6))
for row, lane in enumerate(lanes):
    for e in (e for e in tasks if (e["pid"], e["tid"]) == lane):
        ax.barh(row, e["dur"] / 1e3, left=(e["ts"] - t0) / 1e3, height=0.6, color=colours[e["name"]], linewidth=0)
ax.set_yticks(range(len(lanes)))
ax.set_yticklabels([f"{devices[p]} {streams.get((p, t), t)}" for p, t in lanes])
ax.invert_yaxis()
ax.set_xlabel("time (ms)")
ax.set_title(sys.argv[3] if len(sys.argv) > 3 else "one pipelined training step: tasks per device and stream")
handles = [plt.Rectangle((0, 0), 1, 1, color=colours[n]) for n in labels]
ax.legend(handles, labels, fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.2))
fig.tight_layout()
fig.savefig(out, dpi=90)
