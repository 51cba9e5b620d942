#!/usr/bin/env python3
"""The README's training-parameters table is the one `lathe train --params-markdown` prints
from the parameters' table (src/train/param_table.c), so a changed limit, default or name
cannot leave the README behind; and `lathe train --help` lists every flag of that table."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
README = os.path.join(HERE, "..", "..", "README.md")


def main():
    lathe = os.environ.get("LATHE_BIN")
    if not lathe or not os.path.exists(lathe):
        print("skipped: no lathe binary (LATHE_BIN)")
        return 77
    r = subprocess.run([lathe, "train", "--params-markdown"], capture_output=True, text=True)
    table = r.stdout
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    failures = 0
    if r.returncode != 0 or len(rows) < 20:
        print(f"FAIL  --params-markdown: rc {r.returncode}, {len(rows)} rows: {r.stderr}")
        failures += 1
    with open(README) as f:
        readme = f.read()
    if table not in readme:
        missing = [line for line in table.splitlines() if line not in readme]
        print("FAIL  README.md does not hold the table as printed; regenerate it with "
              "`lathe train --params-markdown`. Lines that differ:")
        for line in missing:
            print(f"        {line}")
        failures += 1
    help_text = subprocess.run([lathe, "train", "--help"], capture_output=True, text=True).stdout
    flags = [cell.strip(" `") for line in rows[2:] for cell in [line.split("|")[2]]
             if cell.strip(" `").startswith("--")]
    for flag in flags:
        if f"  {flag}" not in help_text:
            print(f"FAIL  --help lacks {flag}")
            failures += 1
    print(f"{len(rows) - 2} parameters, {len(flags)} flags; {failures} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
