"""Ingest speed with the default models (MiniLM tokens + pooled text, EfficientNet-Lite0 patches)
on real text-layer PDFs with page images, phase by phase, beside pypdfium2's own text extraction.

Usage (from the repository root; reads ../shared/data/mmlongbench-dev/documents, never copies it)::

    .venv/bin/python benchmarks/ingest_speed.py            # 5 PDFs, 87 pages
    .venv/bin/python benchmarks/ingest_speed.py --quick    # 1 PDF, 9 pages

Rows, all measured in this one run on the same pages:

* **peer: pypdfium2 text layer**: every page's ``get_textpage().get_text_range()``, the floor any
  PDF ingest pays; the end-to-end ratio is ours over it;
* **end to end**: ``colgraph index build DOCS --out IDX --encoders models --json`` as a user runs it
  (isolation worker, committed batches); pages/s over the run's own seconds (the report's), and
  over the whole process (model loading included);
* **phases** (in this process, models loaded once): the reader (text layer + fonts, page render
  with its PNG spool, embedded images), extraction + graph building, MiniLM (the ``text`` role:
  entity and relation vectors under the ``spans`` item rule, and the ``tokens`` role: segments and
  image text views, in one ``encode_document`` call), EfficientNet (page and embedded images) and
  the index write (``add_documents``, one commit per document). Both models run twice per
  document, alternating, once per compute precision (:mod:`colgraph_engine.encoders.precision`):
  ``float32`` (the models as they ship) and ``auto`` (the default: bfloat16 for documents where
  the CPU has it natively, else float32). Every store is compared between the two (cosine per
  vector, lowest and mean); the index is written with the ``auto`` vectors.

Seconds are wall time and, beside them, this process's CPU time (both cores count), which a
busy shared machine inflates less. Writes ``results/ingest_speed.md``, ``.json`` and ``.png``
(``ingest_speed_quick.*`` for ``--quick``).
"""
from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
DATA = HERE.parent.parent / "shared" / "data" / "mmlongbench-dev" / "documents"

# text-layer PDFs with figures (arXiv papers, an ACL paper, a Pew report): 87 pages
PDFS = ["2303.05039v2.pdf", "2310.07609v1.pdf", "2023.acl-long.386.pdf", "2312.10997v5.pdf",
        "PH_2016.06.08_Economy-Final.pdf"]
QUICK = PDFS[:1]
TARGET = 5.0  # pages/s end to end on 2 cores (issue 25, item 6)


class Clock:
    """Wall and CPU seconds of a ``with`` body, added into ``phases[name] = [wall, cpu]``."""

    def __init__(self, phases: dict, name: str):
        self.phases, self.name = phases, name

    def __enter__(self):
        self.t, self.c = time.perf_counter(), time.process_time()

    def __exit__(self, *exc):
        slot = self.phases.setdefault(self.name, [0.0, 0.0])
        slot[0] += time.perf_counter() - self.t
        slot[1] += time.process_time() - self.c


def peer_text(pdfs) -> dict:
    import pypdfium2 as pdfium

    t, c, pages = time.perf_counter(), time.process_time(), 0
    for p in pdfs:
        doc = pdfium.PdfDocument(p)
        for i in range(len(doc)):
            page = doc[i]
            tp = page.get_textpage()
            tp.get_text_range()
            tp.close()
            page.close()
            pages += 1
        doc.close()
    return {"pages": pages, "wall": time.perf_counter() - t, "cpu": time.process_time() - c}


def end_to_end(folder: pathlib.Path, out: pathlib.Path) -> dict:
    cli = pathlib.Path(sys.executable).with_name("colgraph")
    t = time.perf_counter()
    proc = subprocess.run([str(cli), "index", "build", str(folder), "--out", str(out), "--encoders", "models",
                           "--json"], capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.perf_counter() - t
    if proc.returncode != 0:
        return {"error": f"exit {proc.returncode}: {proc.stderr.strip()[-400:]}"}
    start = proc.stdout.find("{")
    rep = json.loads(proc.stdout[start:])
    tot = rep["totals"]
    manifest = json.loads((out / "manifest.json").read_text())
    return {"pages": int(tot["pages"]), "added": int(tot["added"]), "failed": int(tot["failed"]),
            "run_seconds": tot["seconds"], "process_seconds": wall,
            "text_encoder": manifest["encoders"]["text"]["name"],
            "phases": {k[len("seconds_"):]: v for k, v in tot.items() if k.startswith("seconds_")}}


def phases_run(pdfs, tmp: pathlib.Path) -> dict:
    """Reader, extraction + build, MiniLM under each item rule (direct, spans), EfficientNet,
    index write (the spans rule's vectors)."""
    import torch

    from colgraph_engine.encoders import EfficientNetPatchEncoder, MiniLMEncoder, precision
    from colgraph_engine.ingest.process import _build_one, _report_of
    from colgraph_engine.ingest.readers import read_path
    from colgraph_engine.kg import Encoders, KnowledgeIndex
    from colgraph_engine.kg.extract import PhraseExtractor
    from colgraph_engine.kg.vectors import encode_document

    t = time.perf_counter()
    variants = ("float32", "auto")
    rules, images = {}, {}
    for c in variants:
        minilm = MiniLMEncoder(compute=c)  # the ``models`` set's MiniLM and EfficientNet
        rules[c] = Encoders(text=minilm.text_encoder("spans"), tokens=minilm.token_encoder())
        images[c] = Encoders(patches=EfficientNetPatchEncoder(compute=c).patch_encoder())
    load_s = time.perf_counter() - t
    doc_dtype = str(precision.document_dtype()).replace("torch.", "")
    index = KnowledgeIndex.create(tmp / "phases-index", Encoders(text=rules["auto"].text, tokens=rules["auto"].tokens,
                                                                 patches=images["auto"].patches))
    phases = {c: {} for c in variants}
    shared: dict = {}
    count = {"pages": 0, "images": 0, "texts": 0}
    cosines: dict[str, list] = {}
    for n, p in enumerate(pdfs):
        with Clock(shared, "read (total)"):
            r = read_path(p, doc_id=p.name)
        for k in ("text", "fonts", "render", "images", "open"):
            shared.setdefault(f"read: {k}", [0.0, 0.0])[0] += r.stats.seconds.get(k, 0.0)
        rep = _report_of(r)
        with Clock(shared, "extract + build"):
            graph = _build_one(r.document, rep, None, None, None, PhraseExtractor(), 1200, "offline", {})
        count["pages"] += rep.pages
        count["images"] += rep.images
        got = {}
        order = variants if n % 2 == 0 else variants[::-1]  # a noisy neighbour hits both
        for variant in order:
            with Clock(phases[variant], "minilm (text + tokens roles)"):
                got[variant] = encode_document(graph, rules[variant])
            with Clock(phases[variant], "efficientnet"):
                got[variant].update(encode_document(graph, images[variant]))
        _compare(got, count, cosines)
        vectors = got["auto"]
        graph.pixels = {}
        with Clock(shared, "index write"):
            index.add_documents([graph], [vectors])
        del r, graph, got, vectors
    cos = {k: {"min": float(torch.cat(v).min()), "mean": float(torch.cat(v).mean()), "n": int(sum(x.numel() for x in v))}
           for k, v in cosines.items() if v}
    return {**count, "load_seconds": load_s, "shared": shared, "encode": phases, "cosine_auto_vs_float32": cos,
            "document_compute": doc_dtype, "torch_threads": torch.get_num_threads()}


def _compare(got: dict, count: dict, cosines: dict) -> None:
    """Adds one document's cosines between the two precisions' vectors, per store."""
    import torch

    for store, iv in got["auto"].items():
        b = got["float32"][store]
        assert iv.offsets.equal(b.offsets), store
        if iv.values.numel():
            cosines.setdefault(store, []).append(torch.nn.functional.cosine_similarity(iv.values.float(),
                                                                                       b.values.float(), dim=-1))
    count["texts"] += sum(int(v.offsets.numel()) - 1 for k, v in got["auto"].items() if k not in ("image", "region"))


def main(argv=None) -> int:
    import _harness as h

    ap = h.parser(__doc__)
    ap.add_argument("--data", type=pathlib.Path, default=DATA)
    ap.add_argument("--no-e2e", action="store_true", help="skip the end-to-end CLI run")
    args = ap.parse_args(argv)
    names = QUICK if args.quick else PDFS
    pdfs = [args.data / n for n in names]
    if not all(p.is_file() for p in pdfs):
        print(f"ingest_speed: {args.data} lacks {[p.name for p in pdfs if not p.is_file()]}; this benchmark needs "
              f"the MMLongBench-Doc dev PDFs (see ../shared/data/README.md). Nothing measured.")
        return 0
    e = h.env()
    peer = peer_text(pdfs)  # first: it also warms the page cache for both sides
    with tempfile.TemporaryDirectory() as tmp:
        tmp = pathlib.Path(tmp)
        folder = tmp / "docs"
        folder.mkdir()
        for p in pdfs:  # symlinks: the CLI reads exactly these files, nothing is copied
            (folder / p.name).symlink_to(p)
        e2e = None if args.no_e2e else end_to_end(folder, tmp / "cli-index")
        ph = phases_run(pdfs, tmp)
    result = {"pdfs": names, "peer": peer, "end_to_end": e2e, "phases": ph, "target_pages_per_s": TARGET,
              "loadavg_end": os.getloadavg()}
    body = render(result)
    stem = h.stem("ingest_speed", args)
    h.write(stem, "Ingest speed with the default models (MiniLM + EfficientNet) on text-layer PDFs", body, result,
            args.out, e=e)
    if args.out is not None:
        plot(result, pathlib.Path(args.out) / f"{stem}.png")
    return 0


def _per_page(ph: dict, variant: str) -> dict[str, list[float]]:
    """Phase -> [wall, cpu] seconds for `variant`'s encoders with the shared phases."""
    rows = {k: v for k, v in ph["shared"].items() if not k.startswith("read: ")}
    rows.update(ph["encode"][variant])
    return rows


def render(r: dict) -> list[str]:
    peer, e2e, ph = r["peer"], r["end_to_end"], r["phases"]
    pages = ph["pages"]
    peer_rate = peer["pages"] / peer["wall"]
    lines = [f"PDFs ({len(r['pdfs'])}, {pages} pages, {ph['images']} page and embedded images, "
             f"{ph['texts']} texts encoded by MiniLM): " + ", ".join(r["pdfs"]) + ".",
             f"Load average at the end: {r['loadavg_end'][0]:.1f} (other sessions share the 2 cores: wall "
             "times stretch with it, CPU times less).", "",
             "## End to end", "",
             "| row | pages | seconds | pages/s | vs pypdfium2 text |", "|---|---:|---:|---:|---:|",
             f"| peer: pypdfium2 text layer only | {peer['pages']} | {peer['wall']:.2f} | {peer_rate:.1f} | 1 |"]
    if e2e and "error" not in e2e:
        for what, key in ((f"ours: `colgraph index build --encoders models` (the run; text `{e2e['text_encoder']}`)",
                           "run_seconds"),
                          ("ours: the same, whole process (model loading included)", "process_seconds")):
            rate = e2e["pages"] / e2e[key]
            lines.append(f"| {what} | {e2e['pages']} | {e2e[key]:.2f} | {rate:.2f} | {rate / peer_rate:.4f} |")
        rate = e2e["pages"] / e2e["run_seconds"]
        lines += ["", f"Target >= {r['target_pages_per_s']:g} pages/s end to end: "
                      f"**{'met' if rate >= r['target_pages_per_s'] else 'missed'}** ({rate:.2f} pages/s at this "
                      f"load; {e2e['added']} added, {e2e['failed']} failed)."]
    elif e2e:
        lines.append(f"| ours: end to end | — | — | — | failed: {e2e['error']} |")
    lines += ["", f"## Phases (this process; models in `float32` / at `compute=\"auto\"`, which computes "
                  f"documents in {ph['document_compute']} on this CPU)", "",
              "| phase | wall s (float32) | wall s (auto) | CPU s (float32) | CPU s (auto) | ms/page wall (auto) |"
              " auto / float32 (CPU) |", "|---|---:|---:|---:|---:|---:|---:|"]
    before, after = _per_page(ph, "float32"), _per_page(ph, "auto")
    for k in after:
        b, a = before[k], after[k]
        ratio = f"{a[1] / b[1]:.2f}" if b[1] > 0 else "—"
        lines.append(f"| {k} | {b[0]:.2f} | {a[0]:.2f} | {b[1]:.2f} | {a[1]:.2f} | {1000 * a[0] / pages:.0f} "
                     f"| {ratio} |")
    tb = [sum(v[i] for v in before.values()) for i in (0, 1)]
    ta = [sum(v[i] for v in after.values()) for i in (0, 1)]
    lines.append(f"| **sum** | {tb[0]:.2f} | {ta[0]:.2f} | {tb[1]:.2f} | {ta[1]:.2f} | {1000 * ta[0] / pages:.0f} | "
                 f"{ta[1] / tb[1]:.2f} |")
    lines += ["", "Reader sub-phases (wall s, inside `read (total)`): "
              + ", ".join(f"{k[6:]} {v[0]:.2f}" for k, v in ph["shared"].items() if k.startswith("read: ")) + ".",
              "",
              f"Sum of phases: {pages / tb[0]:.2f} pages/s in float32, {pages / ta[0]:.2f} at auto (wall, this "
              f"load); CPU {tb[1] / pages:.3f} s/page in float32, {ta[1] / pages:.3f} at auto: on an idle machine "
              f"with 2 cores the CPU time bounds the rate at about {2 * pages / ta[1]:.1f} pages/s at auto "
              f"({2 * pages / tb[1]:.1f} in float32).", "",
              "Vectors at auto against float32 (cosine per vector):", "",
              "| store | vectors | lowest | mean |", "|---|---:|---:|---:|"]
    lines += [f"| {k} | {v['n']} | {v['min']:.4f} | {v['mean']:.4f} |" for k, v in ph["cosine_auto_vs_float32"].items()]
    lines += ["", f"Models loaded in {ph['load_seconds']:.1f} s (both precisions); torch threads {ph['torch_threads']}."]
    return lines


def plot(r: dict, path: pathlib.Path) -> None:
    import _harness as h

    ph = r["phases"]
    before, after = _per_page(ph, "float32"), _per_page(ph, "auto")
    groups = list(after)
    series = {"float32 (wall ms/page)": {k: 1000 * before[k][0] / ph["pages"] for k in groups},
              "auto (wall ms/page)": {k: 1000 * after[k][0] / ph["pages"] for k in groups}}
    h.bar_plot(path, groups, series, ylabel="ms per page (wall)", labels="{:.0f}",
               title=f"Ingest phases per page, {ph['pages']} pages, 2 shared cores "
                     f"(load {r['loadavg_end'][0]:.1f})")


if __name__ == "__main__":
    raise SystemExit(main())
