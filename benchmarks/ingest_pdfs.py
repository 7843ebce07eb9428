"""Ingest throughput on real PDFs: the 55 documents of MMLongBench-Doc dev, phase by phase.

Usage (from the repository root; reads ../shared/data/mmlongbench-dev/documents, never copies it)::

    .venv/bin/python benchmarks/ingest_pdfs.py                 # everything below (~5-10 min on 2 cores)
    .venv/bin/python benchmarks/ingest_pdfs.py --max-docs 5 --ocr-pages 4 --image-pages 8   # a quick look

Rows, each timed in this one run:

* **end to end, text layer** (the issue's target, >= 20 pages/s): :func:`colgraph_engine.ingest.ingest`
  over every PDF into a fresh directory index: read (text layer + heading sections), offline
  extraction (:class:`~colgraph_engine.kg.CooccurrenceExtractor`), graph building, offline
  encoding (feature-hashing text vectors), committed batches of 8 documents. No page images, no
  embedded images, no OCR: those are the rows below. Per-phase seconds are summed over documents;
  ``commit`` is the rest of the wall time (parts, vector files, manifest, fsync);
* **peer, bare text layer**: pypdfium2 alone, every page's ``get_text_range()`` (what any PDF
  ingest must at least do); ratio = our end-to-end pages/s over it;
* **reader, text layer**: :func:`~colgraph_engine.ingest.readers.read_pdf` alone (no pages, no images);
* **rendering**: the reader with page images at scale 1.0 (72 dpi), render phase only;
* **OCR**: RapidOCR on ``--ocr-pages`` pages (scale 2, pages without a text layer first), pages/s;
* **image encoding**: the offline pixel-patch encoder and EfficientNet-Lite0 (7 x 7 patches, when
  its package is installed) on ``--image-pages`` rendered pages, images/s.

Writes ``results/ingest_pdfs.md`` and ``.json`` beside this file (or under ``--out``), and
``ingest_pdfs.png`` (pages/s per row).
"""
from __future__ import annotations

import argparse
import datetime
import json
import pathlib
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
DATA = HERE.parent.parent / "shared" / "data" / "mmlongbench-dev" / "documents"
sys.path.insert(0, str(HERE))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", type=pathlib.Path, default=DATA)
    ap.add_argument("--max-docs", type=int, default=0, help="first N PDFs by name (0: all)")
    ap.add_argument("--ocr-pages", type=int, default=12)
    ap.add_argument("--image-pages", type=int, default=32)
    ap.add_argument("--out", type=pathlib.Path, default=HERE / "results")
    return ap.parse_args(argv)


def bare_text_layer(pdfs) -> tuple[int, float]:
    import pypdfium2 as pdfium

    t0, pages = time.perf_counter(), 0
    for p in pdfs:
        try:
            doc = pdfium.PdfDocument(p)
        except pdfium.PdfiumError:
            continue
        for i in range(len(doc)):
            page = doc[i]
            page.get_textpage().get_text_range()
            pages += 1
        doc.close()
    return pages, time.perf_counter() - t0


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.data.is_dir():
        print(f"ingest_pdfs: {args.data} is absent; this benchmark needs the MMLongBench-Doc dev PDFs "
              f"(see ../shared/data/README.md). Nothing measured.")
        return 0
    from _impls import machine_info

    from colgraph_engine.ingest import readers
    from colgraph_engine.ingest.folder import ingest
    from colgraph_engine.kg import Encoders, KnowledgeIndex

    pdfs = sorted(args.data.glob("*.pdf"))
    if args.max_docs:
        pdfs = pdfs[:args.max_docs]
    rows, notes = [], []

    # peer first (warms the page cache for everyone alike)
    pages_bare, sec_bare = bare_text_layer(pdfs)
    rows.append({"row": "peer: pypdfium2 text layer only", "pages": pages_bare, "seconds": sec_bare})

    with tempfile.TemporaryDirectory() as tmp:
        folder = pathlib.Path(tmp) / "docs"
        folder.mkdir()
        for p in pdfs:  # symlinks: the folder ingest reads exactly these files, nothing is copied
            (folder / p.name).symlink_to(p)
        index = KnowledgeIndex.create(pathlib.Path(tmp) / "index", Encoders.offline())
        t0 = time.perf_counter()
        report = ingest(index, folder, reader_options={"render_pages": False, "extract_images": False},
                        batch_size=8, progress=True)
        wall = time.perf_counter() - t0
        t = report.totals
        phases = {k[len("seconds_"):]: v for k, v in t.items() if k.startswith("seconds_")}
        phases["commit"] = max(0.0, wall - sum(phases.values()))
        rows.append({"row": "ours: end to end, text layer (read + extract + build + encode + commit)",
                     "pages": int(t["pages"]), "seconds": wall, "phases": phases,
                     "documents": int(t["added"]), "failed": int(t["failed"]),
                     "text_layer_pages": int(t["text_layer_pages"]), "entities": int(t["entities"]),
                     "relations": int(t["relations"])})
        summary = report.table(max_rows=60)

    t0, pages, none_pages, page_images = time.perf_counter(), 0, [], []
    for p in pdfs:
        r = readers.read_pdf(p, render_pages=False, extract_images=False)
        pages += r.stats.pages
    rows.append({"row": "ours: reader, text layer + headings", "pages": pages, "seconds": time.perf_counter() - t0})

    render_s, rendered = 0.0, 0
    for p in pdfs:
        r = readers.read_pdf(p, render_pages=True, extract_images=False)
        render_s += r.stats.seconds.get("render", 0.0)
        rendered += r.stats.page_images
        if r.document is None:
            continue
        for s in r.document.sections:
            if len(s.text.strip()) < 20 and s.page is not None:
                none_pages.append((p, s.page))
        if len(page_images) < args.image_pages:
            page_images += [im.pixels for im in r.document.images][:args.image_pages - len(page_images)]
    rows.append({"row": "ours: page rendering (scale 1.0), render phase", "pages": rendered, "seconds": render_s})

    if args.ocr_pages:
        from colgraph_engine.encoders.ocr import RapidOcr
        from colgraph_engine.eval.pdf import render_pdf

        ocr = RapidOcr()
        chosen = list(dict.fromkeys(none_pages))[:args.ocr_pages]
        if len(chosen) < args.ocr_pages:  # top up with text-layer pages (OCR cost does not depend on the layer)
            extra = [(p, 1) for p in pdfs if (p, 1) not in chosen]
            chosen += extra[:args.ocr_pages - len(chosen)]
        images = []
        for p, n in chosen:
            (page,) = render_pdf(p, pages=[n], scale=2.0)
            images.append(page.image)
        ocr(images[0])  # loads the ONNX models outside the timing
        t0 = time.perf_counter()
        chars = sum(len(ocr(im).text) for im in images)
        rows.append({"row": f"ours: OCR (RapidOCR, scale 2; {sum(1 for c in chosen if c in none_pages)} "
                            f"pages without a text layer)", "pages": len(images), "seconds": time.perf_counter() - t0,
                     "chars": chars})

    if page_images:
        enc = Encoders.offline().patches
        t0 = time.perf_counter()
        enc(page_images)
        rows.append({"row": "ours: image encoding, offline pixel patches", "pages": len(page_images),
                     "seconds": time.perf_counter() - t0, "unit": "images"})
        try:
            from colgraph_engine.encoders import EfficientNetPatchEncoder
            eff = EfficientNetPatchEncoder().patch_encoder()
        except Exception as exc:  # the model package is optional
            notes.append(f"EfficientNet-Lite0 not measured ({exc})")
        else:
            eff(page_images[:2])  # load and warm up outside the timing
            t0 = time.perf_counter()
            eff(page_images)
            rows.append({"row": "ours: image encoding, EfficientNet-Lite0 7x7 patches", "pages": len(page_images),
                         "seconds": time.perf_counter() - t0, "unit": "images"})

    for r in rows:
        r["rate"] = r["pages"] / r["seconds"] if r["seconds"] > 0 else float("inf")
    e2e = rows[1]
    e2e["ratio_to_peer"] = e2e["rate"] / rows[0]["rate"]
    result = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "machine": machine_info(), "pdfs": len(pdfs), "rows": rows, "notes": notes,
              "target": "end to end, text layer >= 20 pages/s on 2 cores (issue 11)",
              "met": e2e["rate"] >= 20.0}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ingest_pdfs.json").write_text(json.dumps(result, indent=1))
    md = render(result, summary)
    (args.out / "ingest_pdfs.md").write_text(md)
    plot(result, args.out / "ingest_pdfs.png")
    print(md)
    return 0


def render(r: dict, summary: str) -> str:
    m = r["machine"]
    lines = [f"# Ingest throughput on MMLongBench-Doc dev PDFs ({r['pdfs']} PDFs)", "",
             f"{r['date']}; {m.get('cpu_model')}, {m.get('cpu_count')} cores; shared, noisy machine. "
             f"Produced by `benchmarks/ingest_pdfs.py`.", "",
             "| row | pages (or images) | seconds | per second | vs peer |", "|---|---:|---:|---:|---:|"]
    for row in r["rows"]:
        ratio = f"{row['ratio_to_peer']:.3f}x" if "ratio_to_peer" in row else ""
        lines.append(f"| {row['row']} | {row['pages']} | {row['seconds']:.2f} | {row['rate']:.1f} | {ratio} |")
    e2e = r["rows"][1]
    lines += ["", f"Target: {r['target']}: **{'met' if r['met'] else 'missed'}** ({e2e['rate']:.1f} pages/s; "
                  f"{e2e['documents']} documents, {e2e['failed']} failed, {e2e['text_layer_pages']} of "
                  f"{e2e['pages']} pages with a text layer, {e2e['entities']} entities, {e2e['relations']} "
                  f"relations).", "", "End-to-end seconds by phase (summed over documents; commit = the rest):", ""]
    lines += [f"* {k}: {v:.2f} s ({v / e2e['seconds']:.0%})" for k, v in sorted(e2e["phases"].items(),
                                                                              key=lambda kv: -kv[1])]
    lines += [f"* note: {n}" for n in r["notes"]]
    lines += ["", "The end-to-end run's summary table (what `colgraph index build` prints):", "", "```", summary,
              "```", ""]
    return "\n".join(lines)


def plot(r: dict, path: pathlib.Path) -> None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    rows = r["rows"]
    fig, ax = plt.subplots(figsize=(9, 0.5 * len(rows) + 1.5))
    names = [x["row"].replace("ours: ", "")[:60] for x in rows]
    ax.barh(names[::-1], [x["rate"] for x in rows][::-1], color=["tab:gray" if x["row"].startswith("peer") else
                                                                  "tab:blue" for x in rows][::-1])
    ax.axvline(20, color="tab:red", ls="--", lw=1, label="target 20 pages/s (end to end)")
    ax.set_xscale("log")
    ax.set_xlabel("pages (or images) per second, log scale")
    ax.set_title(f"Ingest on {r['pdfs']} MMLongBench-Doc dev PDFs, 2 CPU cores")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    raise SystemExit(main())
