"""PyTorch's torch.optim.Adam on numbers d2l gives it. Run by tests/test_trainer.cpp with Debian's
python3 (the one python3-torch installs into); by hand: /usr/bin/python3 tests/adam_torch.py DIR

DIR/adam_in.txt, written by the test (whitespace-separated numbers, float32 values printed exactly):
    cases
    then per case:  lr beta1 beta2 eps weight_decay grad_scale steps n
                    n initial weights
                    steps gradients of n values each
For each case, one float32 tensor w of those weights is trained by torch.optim.Adam(lr=lr,
betas=(beta1, beta2), eps=eps, weight_decay=weight_decay): before step t its .grad is set to
grad_scale * gradient t, then optimizer.step(). After every step this script writes w,
state['exp_avg'] and state['exp_avg_sq'] (n values each, one line each, %.9g: float32 exactly) to
DIR/adam_out.txt, cases and steps in order.
Exit status: 0 done, 77 PyTorch missing (the test is skipped), 1 a malformed input.
"""
import os
import sys

try:
    import torch
except ImportError:
    print("adam_torch.py: PyTorch is not installed for " + sys.executable + "; skipped")
    sys.exit(77)


def main(folder):
    with open(os.path.join(folder, "adam_in.txt")) as f:
        tokens = f.read().split()
    pos = 0

    def take(count):
        nonlocal pos
        if pos + count > len(tokens):
            raise ValueError("adam_in.txt ends early")
        out = [float(x) for x in tokens[pos:pos + count]]
        pos += count
        return out

    lines = []
    (cases,) = take(1)
    for _ in range(int(cases)):
        lr, beta1, beta2, eps, wd, grad_scale, steps, n = take(8)
        steps, n = int(steps), int(n)
        w = torch.tensor(take(n), dtype=torch.float32, requires_grad=True)
        opt = torch.optim.Adam([w], lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=wd)
        for _ in range(steps):
            w.grad = torch.tensor(take(n), dtype=torch.float32) * grad_scale
            opt.step()
            state = opt.state[w]
            for t in (w.detach(), state["exp_avg"], state["exp_avg_sq"]):
                lines.append(" ".join("%.9g" % x for x in t.tolist()))
    if pos != len(tokens):
        raise ValueError("adam_in.txt has %d numbers left over" % (len(tokens) - pos))
    with open(os.path.join(folder, "adam_out.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("adam_torch.py: PyTorch", torch.__version__, "ran", int(cases), "cases")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1]))
    except (OSError, ValueError) as e:
        print("adam_torch.py:", e)
        sys.exit(1)
