#!/usr/bin/env bash
# Mutation testing of one core module with cosmic-ray (pinned), in a throw-away git worktree
# of HEAD, so that the mutated files are never the ones other processes import.
#
#   bash scripts/mutation.sh [MODULE] [SAMPLE] [TESTS...]
#   bash scripts/mutation.sh python_backend/banditspec/config.py 60 tests/unit/test_boundary_pins.py tests/unit/test_decoding.py
#
# MODULE: a file or package under python_backend/; SAMPLE: how many of its mutants to run
# (seeded random sample; 0 = all); TESTS: the pytest selection that must kill them.
# Prints killed / survived / total and the surviving mutants. Figures: docs/reliability.md.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
MODULE=${1:-python_backend/banditspec/config.py}
SAMPLE=${2:-60}
shift $(( $# > 2 ? 2 : $# ))
TESTS=${*:-tests/unit/test_boundary_pins.py tests/unit/test_decoding.py}
WORK=$(mktemp -d "${TMPDIR:-/tmp}/banditspec-mutation.XXXXXX")
trap 'git -C "$ROOT" worktree remove --force "$WORK/tree" >/dev/null 2>&1 || true; rm -rf "$WORK"' EXIT

"$ROOT/.venv/bin/python" -m pip install --quiet --target "$WORK/tools" "cosmic-ray==8.7.0"
git worktree add --quiet --detach "$WORK/tree" HEAD
export PYTHONPATH="$WORK/tools:$WORK/tree/python_backend:$WORK/tree/server:$WORK/tree/client:$WORK/tree/training"
cat > "$WORK/cr.toml" <<EOF
[cosmic-ray]
module-path = "$MODULE"
timeout = 120.0
excluded-modules = []
test-command = "$ROOT/.venv/bin/python -m pytest -x -q -p no:cacheprovider $TESTS"

[cosmic-ray.distributor]
name = "local"
EOF
cd "$WORK/tree"
"$ROOT/.venv/bin/python" -m cosmic_ray.cli init "$WORK/cr.toml" "$WORK/session.sqlite"
"$ROOT/.venv/bin/python" - "$WORK/session.sqlite" "$SAMPLE" <<'EOF'
import random, sqlite3, sys
db, sample = sys.argv[1], int(sys.argv[2])
c = sqlite3.connect(db)
ids = [r[0] for r in c.execute("select job_id from work_items order by rowid")]  # init order
if 0 < sample < len(ids):
    random.Random(15).shuffle(ids)
    drop = [(i,) for i in ids[sample:]]
    c.executemany("delete from mutation_specs where job_id=?", drop)
    c.executemany("delete from work_items where job_id=?", drop)
    c.commit()
print(f"mutants: {len(ids)}, running {c.execute('select count(*) from work_items').fetchone()[0]}")
EOF
"$ROOT/.venv/bin/python" -m cosmic_ray.cli exec "$WORK/cr.toml" "$WORK/session.sqlite"
"$ROOT/.venv/bin/python" - "$WORK/session.sqlite" <<'EOF'
import sqlite3, sys
c = sqlite3.connect(sys.argv[1])
rows = c.execute("""select r.test_outcome, s.operator_name, s.start_pos_row, s.definition_name
                    from work_results r join mutation_specs s on s.job_id = r.job_id""").fetchall()
killed = sum(1 for o, *_ in rows if (o or "").lower() == "killed")
print(f"killed {killed} / {len(rows)} ({100 * killed / max(1, len(rows)):.0f} %)")
for outcome, op, row, name in sorted(rows, key=lambda r: r[2]):
    if (outcome or "").lower() != "killed":
        print(f"  {outcome:9s} line {row:4d} {name or '':28s} {op}")
EOF
