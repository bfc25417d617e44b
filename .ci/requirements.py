"""Print the requirements of one of pyproject.toml's extras, one a line, for ``pip install -r``:
installing an extra through the project (``pip install -e ".[llm]"``) would build its compiled
parts again, a minute each time."""

import sys
import tomllib

with open("pyproject.toml", "rb") as f:
    print("\n".join(tomllib.load(f)["project"]["optional-dependencies"][sys.argv[1]]))
