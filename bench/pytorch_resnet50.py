#!/usr/bin/python3
"""PyTorch reference for bench/model_parallel_bench: the same ResNet-50 training step, timed the same way.

One step of the section's train(model) (PyTorch's "Single-Machine Model Parallel Best Practices") with one batch: torchvision's resnet50(num_classes=1000)
on the CPU, a batch of random 3xSxS inputs, one-hot labels over 1000 classes, nn.MSELoss, SGD lr 0.001;
torch.set_num_threads(T). One warm-up step, then --repeats timed steps; min and median wall time and
CPU time. Prints "RESULT pytorch_resnet50_step_t<T> <seconds>" (the min).

Run it with Debian's own python3 (/usr/bin/python3, which has python3-torch and python3-torchvision):
  /usr/bin/python3 bench/pytorch_resnet50.py --threads 2 --batch 120 --image 128
"""
import argparse
import resource
import statistics
import sys
import time

try:
    import torch
    import torchvision
    from torch import nn, optim
except ImportError as e:
    print(f"PyTorch or torchvision is not available to {sys.executable}: {e} "
          "(apt-get install python3-torch python3-torchvision)")
    sys.exit(77)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=120)
    p.add_argument("--image", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    num_classes = 1000
    model = torchvision.models.resnet50(num_classes=num_classes)
    model.train(True)

    def train():
        loss_fn = nn.MSELoss()
        optimizer = optim.SGD(model.parameters(), lr=0.001)
        one_hot_indices = torch.LongTensor(a.batch).random_(0, num_classes).view(a.batch, 1)
        inputs = torch.randn(a.batch, 3, a.image, a.image)
        labels = torch.zeros(a.batch, num_classes).scatter_(1, one_hot_indices, 1)
        optimizer.zero_grad()
        loss_fn(model(inputs), labels).backward()
        optimizer.step()

    train()  # warm-up
    wall, cpu = [], []
    for _ in range(a.repeats):
        w0, c0 = time.perf_counter(), time.process_time()
        train()
        wall.append(time.perf_counter() - w0)
        cpu.append(time.process_time() - c0)
    print(f"PyTorch {torch.__version__}, torchvision {torchvision.__version__}, {a.threads} thread(s): resnet50 step, "
          f"batch {a.batch} of 3x{a.image}x{a.image}: min {min(wall):.2f} s  median {statistics.median(wall):.2f} s  "
          f"cpu {min(cpu):.2f} s")
    print(f"RESULT pytorch_resnet50_step_t{a.threads} {min(wall):.6g}")
    # Peak resident memory of the process (KB on Linux), as model_parallel_bench reports its own (VmHWM).
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"memory: peak resident {peak_mb:.0f} MB (process)")
    print(f"RESULT pytorch_resnet50_step_peak_rss_mb {peak_mb:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
