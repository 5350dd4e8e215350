"""Files exchanged with PyTorch, both ways. Run by tests/test_safetensors.cpp with Debian's python3
(the one python3-torch installs into); by hand: /usr/bin/python3 tests/safetensors_torch.py DIR

DIR/from_d2l.safetensors was written by d2l's save_parameters for the model below, every value
v[i] = BASE[name] + i / 8 (exact in float32). This script
  1. loads it into nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)) with load_state_dict(strict=True)
     (BatchNorm fills in the num_batches_tracked the file does not hold) and checks every value;
  2. sets every value to -(BASE[name] + i / 8), num_batches_tracked to 7, and writes the model's
     state_dict() to DIR/from_torch.safetensors for the C++ side to load;
  3. with the safetensors package: writes the tensors of step 1 again to DIR/resaved.safetensors,
     which must be byte for byte the file d2l wrote (the same writer rules);
  4. 16-bit floats: DIR/halves_from_d2l.safetensors holds float32 values of every class, "x", and
     d2l's bfloat16 and float16 roundings of them, "x.bf16" and "x.f16": each must be PyTorch's
     x.to(dtype) bit for bit (a NaN only as a NaN: the two keep different NaN bits). It then writes
     DIR/halves_from_torch.safetensors, values "y" and PyTorch's roundings "y.bf16" and "y.f16", and
     DIR/from_torch_bf16.safetensors, the model of step 2 in bfloat16 (model.to(torch.bfloat16)).
Exit status: 0 all passed, 77 PyTorch missing (the test is skipped), 1 a check failed.

Debian bookworm packages python3-torch but not python3-safetensors: without the package, the small
reader and writer of the format in tests/safetensors_stdlib.py (stdlib + torch) stand in, so the
PyTorch side (names, layout, load_state_dict) is still checked; step 3 then does not run.
"""
import os
import sys

try:
    import torch
    from torch import nn
except ImportError:
    print("safetensors_torch.py: PyTorch is not installed for " + sys.executable + "; skipped")
    sys.exit(77)

try:
    from safetensors.torch import load_file, save_file
    HAVE_SAFETENSORS = True
except ImportError:
    HAVE_SAFETENSORS = False
    from safetensors_stdlib import load_file, save_file  # beside this file

BASE = {"0.weight": 0.0, "0.bias": 10.0, "1.weight": 20.0, "1.bias": 30.0, "1.running_mean": 40.0, "1.running_var": 50.0}


def expected(name, shape, sign):
    n = 1
    for d in shape:
        n *= d
    return (sign * (BASE[name] + torch.arange(n, dtype=torch.float32) / 8)).reshape(shape)


def main(folder):
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    ours = load_file(os.path.join(folder, "from_d2l.safetensors"))
    if sorted(ours) != sorted(BASE):
        print("from_d2l.safetensors holds", sorted(ours), "expected", sorted(BASE))
        return 1
    model.load_state_dict(dict(ours), strict=True)  # a copy: BatchNorm adds num_batches_tracked to it
    state = model.state_dict()
    for name in BASE:
        want = expected(name, state[name].shape, 1)
        if state[name].dtype != torch.float32 or not torch.equal(state[name], want):
            print("value mismatch in", name, state[name], want)
            return 1

    with torch.no_grad():
        for name in BASE:
            state[name].copy_(expected(name, state[name].shape, -1))
        state["1.num_batches_tracked"].fill_(7)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, os.path.join(folder, "from_torch.safetensors"))

    if HAVE_SAFETENSORS:
        save_file(ours, os.path.join(folder, "resaved.safetensors"))

    halves = load_file(os.path.join(folder, "halves_from_d2l.safetensors"))
    x = halves["x"]
    for name, dtype in (("x.bf16", torch.bfloat16), ("x.f16", torch.float16)):
        theirs, mine = x.to(dtype), halves[name]
        same = (theirs.view(torch.int16) == mine.view(torch.int16)) | (theirs.isnan() & mine.isnan())
        if mine.dtype != dtype or not bool(same.all()):
            bad = (~same).nonzero()[:5].flatten().tolist()
            print(name, "differs from PyTorch's rounding at", bad, [float(x[i]) for i in bad])
            return 1
    g = torch.Generator().manual_seed(0)
    y = torch.cat([torch.randn(4096, generator=g) * 10.0 ** float(e) for e in range(-9, 7)] +
                  [torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 65519.0, 65520.0, 1e-8, 3e38])])
    save_file({"y": y, "y.bf16": y.to(torch.bfloat16), "y.f16": y.to(torch.float16)},
              os.path.join(folder, "halves_from_torch.safetensors"))
    save_file({k: v.contiguous() for k, v in model.to(torch.bfloat16).state_dict().items()},
              os.path.join(folder, "from_torch_bf16.safetensors"))
    print("safetensors_torch.py: PyTorch", torch.__version__, "read and wrote the files",
          "(safetensors package)" if HAVE_SAFETENSORS else "(stand-in reader/writer: no safetensors package)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
