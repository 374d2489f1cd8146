"""Says in one line what the model of a bundle knows (bundle.json's ``domain``); install.sh prints it.

Plain Python, no edgecap import: it runs with the interpreter install.sh chose,
whatever the virtual environment holds. Usage: python3 bundle-domain.py BUNDLE_DIR
"""

import json
import sys


def line(path: str) -> str:
    """The line for the bundle at ``path``."""
    try:
        with open(path + "/bundle.json", encoding="utf-8") as f:
            doc = json.load(f)
        name, domain = doc.get("name") or "the bundle", doc.get("domain") or {}
        kind, about = domain.get("kind"), domain.get("about", "")
    except (OSError, ValueError, AttributeError):
        return f"model at {path}: its bundle.json cannot be read; run: edgecap validate {path}"
    if kind == "synthetic":
        return (f"model at {path}: {name} knows only a synthetic world ({about}); on a real camera edgecap "
                "marks most scenes unknown and opens no event for them: for real scenes, put a bundle of the "
                "real world there (docs/bundle.md)")
    if kind == "real":
        return f"model at {path}: {name} knows real scenes: {about}"
    return f"model at {path}: {name} does not say what it knows (bundle.json has no domain)"


if __name__ == "__main__":
    print(line(sys.argv[1]))
