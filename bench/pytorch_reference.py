#!/usr/bin/python3
"""PyTorch reference for bench/compare.sh: the same work as our benchmarks, timed the same way.

  lenet   -- d2l "Multi-GPU Training" (section 13.5) on one CPU device: the book's LeNet
             as a function of its parameters (init N(0, 0.01), biases 0), batch 256, lr 0.2, the
             book's sgd (param -= lr * grad / batch_size), real Fashion-MNIST (pixels / 255),
             shuffled each epoch. Times the training steps only (as the book's timer and our
             scratch::train do): steps [warmup, warmup + steps), extrapolated to 235 steps, or a
             whole epoch with --steps 235.
  resnet  -- one training step of d2l's ResNet-18 small-image variant (conv 64@3x3 + BN + ReLU,
             4 stages of 2 residual blocks, global average pool, dense 10) on a batch of 256
             1x28x28 inputs: forward, softmax cross-entropy, backward, SGD update.
  labcnn  -- an epoch of the Gluon lab's CNN (chapters/multi_gpu_concise), batch 64, lr 0.3;
             with --save FILE: train it and write it with chapter 2's parameter names (the file
             multi_gpu_concise --model lab-cnn --load-params FILE evaluates).

Prints "RESULT <key> <value>" lines (seconds) for compare.sh. Run it with Debian's own python3
(/usr/bin/python3, which has python3-torch), e.g.
  /usr/bin/python3 bench/pytorch_reference.py lenet --threads 2
"""
import argparse
import resource
import gzip
import json
import os
import statistics
import struct
import sys
import time

try:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from torch import nn
except ImportError as e:  # compare.sh checks first; this is for direct use
    print(f"PyTorch is not available to {sys.executable}: {e} (apt-get install python3-torch)")
    sys.exit(77)

DATA_DIR = os.environ.get("D2L_DATA_DIR", "/usr/share/datasets/fashion-mnist")


def read_idx(path):
    with (gzip.open(path) if path.endswith(".gz") else open(path, "rb")) as f:
        data = f.read()
    zero, dtype, ndim = struct.unpack(">HBB", data[:4])
    shape = struct.unpack(">" + "I" * ndim, data[4:4 + 4 * ndim])
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(shape)


def load_split(prefix):
    """Fashion-MNIST's "train" or "t10k" split: images (N, 1, 28, 28) in [0, 1], labels (N)."""
    def find(name):
        for suffix in (".gz", ""):
            p = os.path.join(DATA_DIR, name + suffix)
            if os.path.exists(p):
                return p
        sys.exit(f"error: {name} not found in {DATA_DIR} (apt-get install dataset-fashion-mnist)")
    X = torch.from_numpy(read_idx(find(prefix + "-images-idx3-ubyte")).astype(np.float32) / 255.0).reshape(-1, 1, 28, 28)
    y = torch.from_numpy(read_idx(find(prefix + "-labels-idx1-ubyte")).astype(np.int64))
    return X, y


# ---- the book's LeNet from scratch (d2l, "Multi-GPU training", PyTorch tab)
def get_lenet_params():
    scale = 0.01
    params = [torch.randn(size=(20, 1, 3, 3)) * scale, torch.zeros(20),
              torch.randn(size=(50, 20, 5, 5)) * scale, torch.zeros(50),
              torch.randn(size=(800, 128)) * scale, torch.zeros(128),
              torch.randn(size=(128, 10)) * scale, torch.zeros(10)]
    for p in params:
        p.requires_grad_()
    return params


def lenet(X, params):
    h1_conv = F.conv2d(input=X, weight=params[0], bias=params[1])
    h1_activation = F.relu(h1_conv)
    h1 = F.avg_pool2d(input=h1_activation, kernel_size=(2, 2), stride=(2, 2))
    h2_conv = F.conv2d(input=h1, weight=params[2], bias=params[3])
    h2_activation = F.relu(h2_conv)
    h2 = F.avg_pool2d(input=h2_activation, kernel_size=(2, 2), stride=(2, 2))
    h2 = h2.reshape(h2.shape[0], -1)
    h3_linear = torch.mm(h2, params[4]) + params[5]
    h3 = F.relu(h3_linear)
    return torch.mm(h3, params[6]) + params[7]


loss = nn.CrossEntropyLoss(reduction="none")


def sgd(params, lr, batch_size):
    with torch.no_grad():
        for param in params:
            param -= lr * param.grad / batch_size
            param.grad.zero_()


def train_batch(X, y, params, lr):  # one device: split_batch and allreduce are identities
    ls = loss(lenet(X, params), y).sum()
    ls.backward()
    sgd(params, lr, X.shape[0])
    return ls.detach()


def bench_lenet(args):
    X, y = load_split("train")
    torch.manual_seed(0)
    params = get_lenet_params()
    batch, lr = 256, 0.2
    order = torch.randperm(X.shape[0])
    num_batches = (X.shape[0] + batch - 1) // batch  # 235
    times = []
    step = 0

    def run_steps(n):
        nonlocal step
        start = time.perf_counter()
        for _ in range(n):
            idx = order[(step % num_batches) * batch:(step % num_batches + 1) * batch]
            train_batch(X[idx], y[idx], params, lr)
            step += 1
        return time.perf_counter() - start

    run_steps(args.warmup)
    cpu0 = time.process_time()
    for _ in range(args.repeats):
        times.append(run_steps(args.steps) * num_batches / args.steps)
    cpu = (time.process_time() - cpu0) / args.repeats * num_batches / args.steps
    how = "a whole epoch" if args.steps == num_batches else f"{args.steps} steps x {num_batches / args.steps:.2f}"
    print(f"PyTorch {torch.__version__} LeNet epoch (batch 256, {num_batches} steps), {args.threads} thread(s), "
          f"{how}: min {min(times):.2f} s, median {statistics.median(times):.2f} s, CPU {cpu:.2f} s")
    print(f"RESULT pytorch_lenet_epoch_t{args.threads} {min(times):.6g}")
    print(f"RESULT pytorch_lenet_epoch_cpu_t{args.threads} {cpu:.6g}")


# ---- d2l's ResNet-18 small-image variant (d2l "Concise implementation for multiple GPUs")
class Residual(nn.Module):
    def __init__(self, input_channels, num_channels, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(input_channels, num_channels, kernel_size=3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(num_channels, num_channels, kernel_size=3, padding=1)
        self.conv3 = nn.Conv2d(input_channels, num_channels, kernel_size=1, stride=strides) if use_1x1conv else None
        self.bn1 = nn.BatchNorm2d(num_channels)
        self.bn2 = nn.BatchNorm2d(num_channels)

    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3:
            X = self.conv3(X)
        return F.relu(Y + X)


def resnet18(num_classes, in_channels=1):
    def resnet_block(in_channels, out_channels, num_residuals, first_block=False):
        blk = []
        for i in range(num_residuals):
            if i == 0 and not first_block:
                blk.append(Residual(in_channels, out_channels, use_1x1conv=True, strides=2))
            else:
                blk.append(Residual(out_channels, out_channels))
        return nn.Sequential(*blk)

    net = nn.Sequential(nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1), nn.BatchNorm2d(64), nn.ReLU())
    net.add_module("resnet_block1", resnet_block(64, 64, 2, first_block=True))
    net.add_module("resnet_block2", resnet_block(64, 128, 2))
    net.add_module("resnet_block3", resnet_block(128, 256, 2))
    net.add_module("resnet_block4", resnet_block(256, 512, 2))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(512, num_classes)))
    return net


def bench_resnet(args):
    torch.manual_seed(0)
    net = resnet18(10)
    net.train()
    trainer = torch.optim.SGD(net.parameters(), lr=0.1)
    X = torch.rand(args.batch, 1, 28, 28)
    y = torch.randint(0, 10, (args.batch,))

    def step():
        start = time.perf_counter()
        trainer.zero_grad()
        l = F.cross_entropy(net(X), y)
        l.backward()
        trainer.step()
        return time.perf_counter() - start

    for _ in range(args.warmup):
        step()
    cpu0 = time.process_time()
    times = [step() for _ in range(args.repeats)]
    cpu = (time.process_time() - cpu0) / args.repeats
    print(f"PyTorch {torch.__version__} ResNet-18 training step (batch {args.batch}, 1x28x28), {args.threads} thread(s): "
          f"min {min(times):.2f} s, median {statistics.median(times):.2f} s, CPU {cpu:.2f} s")
    print(f"RESULT pytorch_resnet18_step_t{args.threads} {min(times):.6g}")
    print(f"RESULT pytorch_resnet18_step_cpu_t{args.threads} {cpu:.6g}")
    # Peak resident memory of the process, as resnet18_step_bench reports its own (VmHWM).
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"memory: peak resident {peak_mb:.0f} MB (process)")
    print(f"RESULT pytorch_resnet18_step_peak_rss_mb {peak_mb:.1f}")


# ---- the Gluon lab's CNN (chapters/multi_gpu_concise's lab_cnn)
# Our names (Conv2D and Dense carry their relu, so the indices skip PyTorch's ReLU modules).
LAB_NAMES = {"0": "0", "3": "2", "7": "5", "9": "6"}


def lab_cnn():
    net = nn.Sequential(nn.Conv2d(1, 20, 3), nn.ReLU(), nn.MaxPool2d(2, 2), nn.Conv2d(20, 50, 5), nn.ReLU(),
                        nn.MaxPool2d(2, 2), nn.Flatten(), nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))
    for m in net:  # Gluon's default initialisation: weights uniform in [-0.07, 0.07], biases zero
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.uniform_(m.weight, -0.07, 0.07)
            nn.init.zeros_(m.bias)
    return net


def save_safetensors(path, tensors):
    """A minimal safetensors writer (Debian has no python3-safetensors): F32 tensors, names sorted."""
    header, offset, blobs = {}, 0, []
    for name in sorted(tensors):
        data = tensors[name].detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        blobs.append(data)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text.encode() + b"".join(blobs))
    os.replace(tmp, path)


def bench_lab_cnn(args):
    """The lab's run(1, 64, .3): SGD lr 0.3 on the batch's mean loss, batch 64, shuffled Fashion-MNIST.
    Times --steps steps extrapolated to the 938 of an epoch (--steps 0: whole epochs). With --save:
    trains --epochs epochs on the first --train-subset images instead, prints the test accuracy on the
    first --test-subset test images, and writes the net with chapter 2's names to --save."""
    X, y = load_split("train")
    if args.train_subset:
        X, y = X[:args.train_subset], y[:args.train_subset]
    torch.manual_seed(0)
    net = lab_cnn()
    trainer = torch.optim.SGD(net.parameters(), lr=0.3)
    batch = 64
    num_batches = (X.shape[0] + batch - 1) // batch
    step = 0
    order = torch.randperm(X.shape[0])

    def run_steps(n):
        nonlocal step, order
        start = time.perf_counter()
        for _ in range(n):
            if step % num_batches == 0 and step > 0:
                order = torch.randperm(X.shape[0])
            idx = order[(step % num_batches) * batch:(step % num_batches + 1) * batch]
            trainer.zero_grad()
            F.cross_entropy(net(X[idx]), y[idx]).backward()
            trainer.step()
            step += 1
        return time.perf_counter() - start

    if args.save:
        run_steps(args.epochs * num_batches)
        Xt, yt = load_split("t10k")
        if args.test_subset:
            Xt, yt = Xt[:args.test_subset], yt[:args.test_subset]
        with torch.no_grad():
            acc = (net(Xt).argmax(1) == yt).float().mean().item()
        names = {}
        for key, value in net.state_dict().items():
            index, rest = key.split(".", 1)
            names[LAB_NAMES[index] + "." + rest] = value
        save_safetensors(args.save, names)
        print(f"PyTorch {torch.__version__} lab CNN, {args.epochs} epoch(s) on {X.shape[0]} images: test acc {acc:.4f} "
              f"on {Xt.shape[0]} test images; saved to {args.save}")
        print(f"RESULT pytorch_lab_cnn_test_acc {acc:.6g}")
        return
    steps = args.steps if args.steps else num_batches
    run_steps(args.warmup)
    times = []
    cpu0 = time.process_time()
    for _ in range(args.repeats):
        times.append(run_steps(steps) * num_batches / steps)
    cpu = (time.process_time() - cpu0) / args.repeats * num_batches / steps
    how = "whole epochs" if steps == num_batches else f"{steps} steps x {num_batches / steps:.2f}"
    print(f"PyTorch {torch.__version__} lab CNN epoch (batch 64, {num_batches} steps), {args.threads} thread(s), "
          f"{how}: min {min(times):.2f} s, median {statistics.median(times):.2f} s, CPU {cpu:.2f} s")
    print(f"RESULT pytorch_lab_cnn_epoch_t{args.threads} {min(times):.6g}")
    print(f"RESULT pytorch_lab_cnn_epoch_cpu_t{args.threads} {cpu:.6g}")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=["lenet", "resnet", "labcnn"])
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--steps", type=int, default=60, help="lenet: steps per timed repeat (235 = a whole epoch)")
    p.add_argument("--warmup", type=int, default=None, help="untimed steps first (lenet 5, resnet 1)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch", type=int, default=256, help="resnet: batch size")
    p.add_argument("--save", help="labcnn: train --epochs epochs, print the test accuracy, save the net here (safetensors)")
    p.add_argument("--epochs", type=int, default=1, help="labcnn --save: epochs")
    p.add_argument("--train-subset", type=int, default=0, help="labcnn: the first N training images (0: all)")
    p.add_argument("--test-subset", type=int, default=0, help="labcnn --save: the first N test images (0: all)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.warmup is None:
        args.warmup = 1 if args.what == "resnet" else 5
    {"lenet": bench_lenet, "resnet": bench_resnet, "labcnn": bench_lab_cnn}[args.what](args)


if __name__ == "__main__":
    main()
