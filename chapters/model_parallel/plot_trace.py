"""Draws --trace timelines as PNGs (one lane per device and stream, one bar per task) for pages that
cannot embed Perfetto. Needs Debian's python3-matplotlib (/usr/bin/python3).

  plot_trace.py TRACE.json OUT.png [TITLE]
      one step; bars coloured by label (stage, forward/backward, micro-batch)
  plot_trace.py --compare OUT.png NAME=TRACE.json [NAME=TRACE.json ...]
      several steps stacked on one time axis (e.g. gpipe=a.json 1f1b=b.json zb-h1=c.json); compute
      lanes only, bars coloured by what they do (forward, backward B, weight gradient W,
      recomputation), each panel titled with its compute streams' idle fraction"""
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    events = json.load(open(path, encoding="utf-8"))["traceEvents"]
    devices = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    streams = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "thread_name"}
    tasks = [e for e in events if e.get("ph") == "X"]
    return devices, streams, tasks


def one(trace, out, title):
    devices, streams, tasks = load(trace)
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
    ax.set_title(title or "one pipelined training step: tasks per device and stream")
    handles = [plt.Rectangle((0, 0), 1, 1, color=colours[n]) for n in labels]
    ax.legend(handles, labels, fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.2))
    fig.tight_layout()
    fig.savefig(out, dpi=90)


KINDS = [("fwd", "forward F", "tab:blue"), ("recompute", "recomputed forward", "tab:cyan"),
         ("bwd", "backward (zb-h1: input gradient B)", "tab:orange"), ("wgrad", "weight gradient W", "tab:green")]


def kind(label):
    for key, _, colour in KINDS:
        if f" {key} " in label:
            return colour
    return "tab:gray"


def compare(out, pairs):
    runs = [(name, *load(path)) for name, path in (p.split("=", 1) for p in pairs)]
    spans = []
    for _, _, streams, tasks in runs:
        compute = [e for e in tasks if streams.get((e["pid"], e["tid"]), "").endswith("compute")]
        spans.append(max(e["ts"] + e["dur"] for e in compute) - min(e["ts"] for e in compute))
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 1.6 * len(runs) + 1.2), sharex=True)
    for ax, (name, devices, streams, tasks) in zip(axes, runs):
        compute = [e for e in tasks if streams.get((e["pid"], e["tid"]), "").endswith("compute")]
        t0 = min(e["ts"] for e in compute)
        t1 = max(e["ts"] + e["dur"] for e in compute)
        lanes = sorted({(e["pid"], e["tid"]) for e in compute})
        idle = []
        for row, lane in enumerate(lanes):
            mine = [e for e in compute if (e["pid"], e["tid"]) == lane]
            busy = sum(e["dur"] for e in mine)  # tasks of one stream never overlap
            idle.append(f"{devices[lane[0]]} {1 - busy / (t1 - t0):.2f}")
            for e in mine:
                ax.barh(row, e["dur"] / 1e3, left=(e["ts"] - t0) / 1e3, height=0.7, color=kind(e["name"]), linewidth=0)
        ax.set_yticks(range(len(lanes)))
        ax.set_yticklabels([devices[p] for p, _ in lanes])
        ax.invert_yaxis()
        ax.set_title(f"{name}: {(t1 - t0) / 1e3:.0f} ms, idle " + ", ".join(idle), fontsize=9)
    axes[-1].set_xlabel("time (ms)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for _, _, c in KINDS]
    axes[-1].legend(handles, [n for _, n, _ in KINDS], fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    fig.tight_layout()
    fig.savefig(out, dpi=90)


if len(sys.argv) >= 4 and sys.argv[1] == "--compare":
    compare(sys.argv[2], sys.argv[3:])
elif len(sys.argv) in (3, 4) and sys.argv[1] != "--compare":
    one(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
else:
    sys.exit(__doc__)
