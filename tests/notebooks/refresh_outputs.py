"""Re-execute notebooks and store the outputs of ``nbval-check-output`` cells only.

Run after editing a notebook: ``python tests/notebooks/refresh_outputs.py [NOTEBOOK...]``
(default: every notebook under ``notebooks/``). Other cells keep no outputs, so
``pytest --nbval-lax`` compares just the tagged cells.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import nbformat
from jupyter_client.manager import start_new_kernel

CHECK = "nbval-check-output"
ROOT = Path(__file__).resolve().parents[2]


def refresh(path: Path, timeout: float = 60.0) -> None:
    """Execute ``path`` top to bottom in a fresh kernel; rewrite it with checked outputs."""
    book = nbformat.read(path, as_version=4)
    km, kc = start_new_kernel(kernel_name="python3", cwd=tempfile.mkdtemp())
    try:
        count = 0
        for cell in book.cells:
            if cell.cell_type != "code":
                continue
            count += 1
            msg_id = kc.execute(cell.source)
            outs: list[nbformat.NotebookNode] = []
            while True:
                msg = kc.get_iopub_msg(timeout=timeout)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream":
                    if outs and outs[-1].output_type == "stream" \
                            and outs[-1].name == content["name"]:
                        outs[-1].text += content["text"]
                    else:
                        outs.append(nbformat.v4.new_output("stream", name=content["name"],
                                                           text=content["text"]))
                elif kind == "execute_result":
                    outs.append(nbformat.v4.new_output(
                        "execute_result", data=content["data"],
                        execution_count=content["execution_count"]))
                elif kind == "error":
                    raise RuntimeError(f"{path.name}: {content['ename']}: {content['evalue']}"
                                       f"\nin cell:\n{cell.source}")
                elif kind == "status" and content["execution_state"] == "idle":
                    break
            tagged = CHECK in cell.metadata.get("tags", [])
            cell.outputs = outs if tagged else []
            cell.execution_count = count if tagged else None
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    nbformat.validate(book)
    nbformat.write(book, path)


def main(argv: list[str]) -> None:
    """Refresh the notebooks named in ``argv`` (default: all)."""
    os.environ.setdefault("IPYTHONDIR", tempfile.mkdtemp())
    os.environ.setdefault("JUPYTER_RUNTIME_DIR", tempfile.mkdtemp())
    paths = [Path(a) for a in argv] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    for path in paths:
        refresh(path)
        print("refreshed", path)


if __name__ == "__main__":
    main(sys.argv[1:])
