"""install.sh tells the user what the installed model knows (deploy/bundle-domain.py; issue #26)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "deploy" / "bundle-domain.py"


def _line(bundle: Path) -> str:
    # -I as install.sh runs it: no user site, no edgecap on the path.
    done = subprocess.run([sys.executable, "-I", str(SCRIPT), str(bundle)], capture_output=True, text=True,
                          timeout=60, check=True)
    assert done.stderr == "" and len(done.stdout.splitlines()) == 1
    return done.stdout.strip()


def test_the_demo_is_said_to_know_only_a_synthetic_world():
    line = _line(REPO / "models" / "demo" / "bundle")
    assert line.startswith(f"model at {REPO / 'models' / 'demo' / 'bundle'}: edgecap-demo-shapes knows only a "
                           "synthetic world (coloured circles")
    assert "marks most scenes unknown and opens no event for them" in line


@pytest.mark.parametrize("domain, says", [
    ({"kind": "real", "about": "COCO's 80 objects"}, "knows real scenes: COCO's 80 objects"),
    (None, "does not say what it knows (bundle.json has no domain)"),
    ("not an object", "its bundle.json cannot be read; run: edgecap validate"),
])
def test_a_real_an_undeclared_and_an_unreadable_domain(tmp_path: Path, domain, says: str):
    bundle = tmp_path / "bundle"
    shutil.copytree(REPO / "models" / "demo" / "bundle", bundle)
    doc = json.loads((bundle / "bundle.json").read_text())
    doc.pop("domain")
    if domain is not None:
        doc["domain"] = domain
    (bundle / "bundle.json").write_text(json.dumps(doc))
    assert says in _line(bundle)
    (bundle / "bundle.json").write_text("{")
    assert "cannot be read" in _line(bundle)
