"""Regenerates 1/checkpoint.tl: gradient-boosted trees that give the probability that a 2-D point lies inside the
unit circle (the forest beside circle_classifier's MLP in circle_pipeline).

Trained here on synthetic points (seeded) with scikit-learn, converted to a Treelite checkpoint (what Triton's FIL
backend reads for scikit-learn models). Needs `pip install 'switchyard[fil]'`:
    python model_repository/circle_forest/make_model.py
"""

from pathlib import Path

import numpy as np
import treelite
from sklearn.ensemble import GradientBoostingClassifier


def main() -> None:
    rng = np.random.default_rng(0)
    points = (rng.random((4096, 2)) * 4 - 2).astype(np.float32)
    inside = ((points**2).sum(axis=1) < 1).astype(np.int64)
    forest = GradientBoostingClassifier(n_estimators=40, max_depth=3, learning_rate=0.3, random_state=0)
    forest.fit(points, inside)
    print(f"training accuracy {forest.score(points, inside):.3f}")
    out = Path(__file__).resolve().parent / "1" / "checkpoint.tl"
    treelite.sklearn.import_model(forest).serialize(str(out))
    print(f"wrote {out} ({out.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
