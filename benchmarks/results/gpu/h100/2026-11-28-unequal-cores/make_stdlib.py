"""The corpus of this folder's runs, rebuilt (the 2026-11-27 one was not kept): every
`.py` file of Python 3.11.7's standard library outside site-packages, in sorted path
order, concatenated as they are; the 4 files that are not UTF-8 are left out
(test/encoded_modules/module_iso_8859_1.py, test/encoded_modules/module_koi8_r.py,
test/test_source_encoding.py, test/tokenizedata/badsyntax_pep3120.py). 1786 files,
31,512,085 bytes; then

    pcp data prepare stdlib.txt -o stdlib --tokenizer bpe --vocab-size 8192

gave 7,780,341 training and 864,486 validation tokens.

    python make_stdlib.py /root/.pyenv/versions/3.11.7/lib/python3.11 stdlib.txt
"""

import sys
from pathlib import Path

root, out = Path(sys.argv[1]), Path(sys.argv[2])
parts = []
for path in sorted(root.rglob("*.py")):
    if "site-packages" in path.relative_to(root).parts:
        continue
    try:
        parts.append(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        print(f"left out (not UTF-8): {path.relative_to(root)}")
out.write_text("".join(parts), encoding="utf-8")
