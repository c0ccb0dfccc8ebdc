"""Regenerates 1/model.onnx: a tiny MLP that says whether a 2-D point lies inside the unit circle.

Trained here on synthetic points (seeded), exported with torch.onnx. Needs `pip install onnx` beside torch:
    python model_repository/circle_classifier/make_model.py
"""

from pathlib import Path

import torch


def main() -> None:
    torch.manual_seed(0)
    points = torch.rand(4096, 2) * 4 - 2
    labels = (points.pow(2).sum(1) < 1).long()  # 1 = inside
    net = torch.nn.Sequential(
        torch.nn.Linear(2, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2)
    )
    opt = torch.optim.Adam(net.parameters(), lr=0.01)
    for _ in range(600):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(net(points), labels)
        loss.backward()
        opt.step()
    accuracy = (net(points).argmax(1) == labels).float().mean().item()
    print(f"training accuracy {accuracy:.3f}")
    model = torch.nn.Sequential(net, torch.nn.Softmax(dim=1)).eval()
    out = Path(__file__).resolve().parent / "1" / "model.onnx"
    torch.onnx.export(
        model,
        (torch.zeros(1, 2),),
        str(out),
        dynamo=False,
        input_names=["FEATURES"],
        output_names=["PROBABILITIES"],
        dynamic_axes={"FEATURES": {0: "batch"}, "PROBABILITIES": {0: "batch"}},
    )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
