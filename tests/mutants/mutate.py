"""mutate.py IN OUT OLD NEW: writes IN to OUT with the one occurrence of OLD replaced by NEW.
A mutant that does not apply (OLD missing or ambiguous) is a build error, never a silent pass."""
import sys

src, out, old, new = sys.argv[1:5]
text = open(src, encoding="utf-8").read()
count = text.count(old)
if count != 1:
    sys.exit(f"mutate.py: {src}: expected exactly one occurrence of {old!r}, found {count}")
with open(out, "w", encoding="utf-8") as f:
    f.write(f"// MUTANT of {src}: {old!r} -> {new!r}\n")
    f.write(text.replace(old, new))
