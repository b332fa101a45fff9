#!/usr/bin/env bash
# Reproduce the session shown in docs/drafts.md in a scratch copy of this folder:
#   docs/drafts-example/walkthrough.sh
# The mock model replays mock-script.json (a broken first answer, then a repaired one).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${PIPELINE_BIN:-$here/../../.venv/bin}
work=$(mktemp -d)
cp "$here/steps.py" "$here/POLICY.toml" "$here/mock-script.json" "$work/"
cd "$work" && mkdir -p out
export PATH="$bin:$PATH" LEDGERFLOW_MOCK_MODEL=mock-script.json
show() { echo "\$ $*"; "$@"; echo "[exit $?]"; echo; }
REQUEST="double the numbers 1 to 10, add them up, save the total to out/total.txt and show it"
python3 -c "import json; d = json.load(open('mock-script.json')); json.dump({'turns': d['turns'][:1]}, open('first.json', 'w'))"
LEDGERFLOW_MOCK_MODEL=first.json show pipeline draft "$REQUEST" --tasks steps.py --policy POLICY.toml -o broken.toml --repairs 0
show pipeline validate broken.toml --policy POLICY.toml
show pipeline draft "$REQUEST" --tasks steps.py --policy POLICY.toml -o draft.toml
show cat draft.toml
show pipeline run draft.toml
show pipeline validate draft.toml --policy POLICY.toml --plan
digest=$(sed -n 's/^# draft-digest: \([0-9a-f]\{12\}\).*/\1/p' draft.toml)
show pipeline approve-draft draft.toml --digest "$digest" --reason "checked the output path"
show pipeline run draft.toml
show cat out/total.txt
sed -i 's/rows = 10/rows = 100/' draft.toml
show pipeline run draft.toml
run=$(sed -n 's/^# draft-run: //p' draft.toml)
show pipeline usage "$run"
rm -rf "$work"
