"""torchvision's ResNet-50 as the reference for chapter 3's resnet50 (run by test_model_parallel.cpp
with Debian's python3, which python3-torch and python3-torchvision install into; by hand:
/usr/bin/python3 chapters/model_parallel/torchvision_resnet50.py DIR).

Writes into DIR:
  resnet50.safetensors   torchvision.models.resnet50(num_classes=10).state_dict() after
                         torch.manual_seed(0): torchvision's names, num_batches_tracked included
  reference.safetensors  x (4, 3, 64, 64), x[i] = sin(0.37 i) in float32 order; the target
                         (4, 10), row i one-hot at (7 i + 3) mod 10; in training mode:
                         y = model(x), loss = nn.MSELoss()(y, target), and after loss.backward()
                         "grad/<name>" for every parameter and "after/<name>" for every BatchNorm
                         running statistic; "grad64/<name>" and "after64/<name>": the same gradients
                         and statistics from a float64 copy of the model (rounded to float32), the
                         reference both float32 implementations are measured against (training-mode
                         BatchNorm over few values per channel makes these gradients sensitive to
                         rounding: PyTorch's own float32 ones differ from them by about 4%); in
                         evaluation mode (after that step's statistics): y_eval = model(x).
Exit status: 0 written, 77 PyTorch or torchvision missing (the test is skipped).
"""
import copy
import os
import sys

try:
    import torch
    import torchvision
    from torch import nn
except ImportError as e:
    print("torchvision_resnet50.py: " + str(e) + " for " + sys.executable + "; skipped")
    sys.exit(77)

# The safetensors writer of the tests' PyTorch scripts (stdlib + torch: Debian 12 has no safetensors package).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "tests"))
from safetensors_stdlib import save_file  # noqa: E402


def main(folder):
    torch.manual_seed(0)
    model = torchvision.models.resnet50(num_classes=10)
    save_file(model.state_dict(), os.path.join(folder, "resnet50.safetensors"))
    model64 = copy.deepcopy(model).double()

    N, C = 4, 10
    x = torch.sin(0.37 * torch.arange(N * 3 * 64 * 64, dtype=torch.float32)).reshape(N, 3, 64, 64)
    target = torch.zeros(N, C)
    for i in range(N):
        target[i, (7 * i + 3) % C] = 1
    model.train(True)
    y = model(x)
    loss = nn.MSELoss()(y, target)
    loss.backward()
    model64.train(True)
    nn.MSELoss()(model64(x.double()), target.double()).backward()
    out = {"x": x, "target": target, "y": y, "loss": loss.reshape(1)}
    for name, p in model.named_parameters():
        out["grad/" + name] = p.grad
    for name, p in model64.named_parameters():
        out["grad64/" + name] = p.grad.float()
    for name, b in model.named_buffers():
        if "running" in name:
            out["after/" + name] = b
    for name, b in model64.named_buffers():
        if "running" in name:
            out["after64/" + name] = b.float()
    model.train(False)
    with torch.no_grad():
        out["y_eval"] = model(x)
    save_file(out, os.path.join(folder, "reference.safetensors"))
    print("torchvision_resnet50.py: torch", torch.__version__, "torchvision", torchvision.__version__,
          "loss", float(loss))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
