"""Steps over local paths, artifacts on an object store: stage the inputs, run, publish the outputs.

For `artifacts: s3://bucket/prefix`, `staged(cfg, run_id)` (under the writer's lock object) copies into a
scratch folder what a night reads: every run's small records (run.json, gate.json, the index manifest),
the whole folders of the previous run (embed cache, chunk reuse, ingest diff), the live run (diff against
live) and the run itself (a rerun), the text vectors and rerank logits the newest earlier evaluation kept
(read-only), `LIVE` and the promotions log. The steps run on that folder exactly as on a local artifacts
folder; on success `publish` writes back what changed, in this order:

1. run files, each index version's files before its `index/manifest.json` (G2: the manifest is last);
   a complete version's files are write-once (object_store.WriteOnceViolation on other bytes, G1);
2. `LIVE.decision.json`, then `LIVE` as one PUT;
3. each new promotions record as its own object `promotions/<time>-<sha>.json` (append-only by unique key,
   so two writers never rewrite one log object), after LIVE as in a local artifacts folder: the log never
   claims a promotion whose LIVE PUT failed, and promote's retry writes a record lost after it; and each new
   check-set scoring as `check_scorings/<run>-<design>.json` (the log sourcegate/evals/check_log.py keeps as
   check_scorings.jsonl in a local artifacts folder);
4. the run folders retention removed.

Publication is fenced: before it writes anything, before the manifests, before LIVE (and the decision written
just before it), and before removals it checks that this writer's lease on the store still holds (lock.fence:
not lapsed, no newer holder), and a writer that moves LIVE checks that the store's LIVE is still the one it staged (the
steps' "never move LIVE backwards" judged that copy). Either failing raises, naming who, and publishes no
LIVE. A night that fails (the store unreachable included) publishes no LIVE: the live version stays. The
scratch folder is always removed. Object keys become local paths only through object_store.local_path.
"""

from __future__ import annotations

import functools
import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from sourcegate.artifact_io import run_folder as rf
from sourcegate.artifact_io.run_folder import PUBLISHED_AS, TEXT_VECTORS
from sourcegate.evals import check_log
from sourcegate.pipelines.batches import shard_range
from sourcegate.pipelines.config import PipelineConfig
from sourcegate.pipelines.release.decision import PUBLISHED as PUBLISHED_DECISION
from sourcegate.pipelines.release.lock import command_line, fence, writer_lock
from sourcegate.pipelines.versions import promotions, segments
from sourcegate.pipelines.versions.object_store import ObjectStore, StoreUnavailable, is_remote, local_path, sha256_path

RECORDS = (rf.RUN_INFO, rf.GATE, rf.INDEX_MANIFEST)  # every run's: listing, ordering, retention
INDEX_FILES = f"{rf.INDEX}/"  # a run's index version files: needed only to open or verify that version
PROMOTIONS_PREFIX = "promotions/"
CHECK_SCORINGS_PREFIX = "check_scorings/"  # one object per scoring of a check set: two writers never share one
LIVE = "LIVE"
STAGE_THREADS = 4  # objects staged at once
SKIPPED = (".sourcegate.lock", ".sourcegate.lock.json")


class LiveMoved(RuntimeError):
    """LIVE on the store is no longer the one this writer staged: another writer promoted meanwhile."""


@dataclass
class Snapshot:
    """What was staged: key -> sha256 of each downloaded object, the runs seen, LIVE, promotion records."""

    sha256: dict[str, str] = field(default_factory=dict)
    stat: dict[str, tuple[int, int]] = field(default_factory=dict)  # key -> (size, mtime_ns) as staged
    runs: set[str] = field(default_factory=set)
    live: str | None = None
    records: set[str] = field(default_factory=set)  # record_key of each promotion record staged
    scorings: int = 0  # check-set scorings staged into check_scorings.jsonl (the newer lines are this writer's)


def run_of(key: str) -> str | None:
    parts = key.split("/")
    return parts[1] if len(parts) > 2 and parts[0] == rf.RUNS else None


ANY = "*"  # in a Reads entry: every file of that run folder outside index/


@dataclass(frozen=True)
class Reads:
    """What a step reads beyond every run's RECORDS, LIVE and the promotions log: names (or folder prefixes
    such as "index/", or ANY) inside its own run folder, the previous run's (newest earlier one with
    chunks: ingest diff, chunk reuse, embed cache), the live run's and the earlier evaluation's (newest
    earlier run that kept its text vectors: RunFolder.earlier_evaluation)."""

    own: tuple[str, ...] = ()
    previous: tuple[str, ...] = ()
    live: tuple[str, ...] = ()
    kept: tuple[str, ...] = ()  # read in the earlier evaluation's run folder (staged read-only)
    named: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (run id, names) for a command on given runs
    shard: tuple[str, int, int] | None = None  # (own Parquet name, shard, shards): only that shard's row groups
    check_log: bool = False  # the log of check-set scorings (the gate reads and appends to it)


def reading(names: tuple[str, ...], *runs: str) -> Reads:
    """What a command on `runs` reads: `names` in each."""
    return Reads(named=tuple((run, names) for run in runs))


KEPT = rf.KEPT  # an earlier evaluation's, read beside its gate.json (a record: every run's is staged)
NIGHT = Reads(
    own=(ANY, INDEX_FILES), previous=(ANY,), live=(ANY,), kept=KEPT, check_log=True
)  # `sourcegate run`: every step in one
STEP_READS = {  # a DAG task stages only what its step reads (sourcegate/pipelines/app/steps.py)
    "ingest": Reads(own=(rf.QUARANTINE,), previous=(rf.DOCUMENTS,)),
    "chunk": Reads(own=(rf.DOCUMENTS, rf.QUARANTINE), previous=(rf.DOCUMENTS, rf.CHUNKS_TEXT)),
    "embed": Reads(own=(rf.CHUNKS_TEXT,), previous=(rf.CHUNKS,)),
    "merge": Reads(own=(rf.CHUNKS_TEXT, f"{rf.EMBED_SHARDS}/")),
    "validate": Reads(own=(rf.CHUNKS, rf.QUARANTINE, rf.QUALITY)),
    "load": Reads(own=(rf.CHUNKS, rf.CHUNKS_VALID), live=(rf.CHUNKS, rf.CHUNKS_VALID)),
    "evaluate": Reads(own=(INDEX_FILES, rf.CHUNKS, rf.CHUNKS_VALID), kept=KEPT),
    "gate": Reads(
        own=(rf.CALIBRATION, rf.PRECISION, rf.EVAL_ERRORS, rf.QUESTIONS), live=(rf.QUESTIONS,), check_log=True
    ),
    "promote": Reads(own=(INDEX_FILES, rf.CALIBRATION)),  # the decision gate.json records is checked against it
    "cleanup": Reads(),
    # sourcegate_recalibrate: LIVE (read only), then an evaluation of the live version into the recal run's folder
    "live_version": Reads(),
    "evaluate_live": Reads(live=(INDEX_FILES, rf.CHUNKS, rf.CHUNKS_VALID), kept=KEPT),
}
READ_ONLY = {"live_version"}  # tasks that publish nothing: staged without the writer lock


def previous_of(keys: dict[str, int], run_id: str | None) -> str | None:
    """The newest run before `run_id` with chunks (RunFolder.previous, on the store's listing)."""
    with_chunks = sorted({run_of(k) for k in keys if k.endswith(f"/{rf.CHUNKS}") and run_of(k)})
    earlier = [r for r in with_chunks if run_id is None or r < run_id]
    return earlier[-1] if earlier else None


def earlier_evaluation_of(keys: dict[str, int], run_id: str | None) -> str | None:
    """The newest run before `run_id` whose evaluation kept its text vectors (RunFolder.earlier_evaluation, on the
    store's listing): the evaluation loads its text vectors and rerank logits from that folder."""
    kept = sorted({run_of(k) for k in keys if k.endswith(f"/{TEXT_VECTORS}") and run_of(k)})
    earlier = [r for r in kept if run_id is None or r < run_id]
    return earlier[-1] if earlier else None


def matches(inside: str, names: tuple[str, ...]) -> bool:
    return any(
        inside == n or (n.endswith("/") and inside.startswith(n)) or (n == ANY and not inside.startswith(INDEX_FILES))
        for n in names
    )


def wanted(key: str, reads: Reads, roles: dict[str, tuple[str, ...]]) -> bool:
    """Is `key` read? `roles`: run id -> the names read in it (own, previous, live; merged when one run is two)."""
    run = run_of(key)
    if run is None:
        return False
    inside = key.split("/", 2)[2]
    return inside in RECORDS or matches(inside, roles.get(run, ()))


def roles_of(
    reads: Reads, run_id: str | None, previous: str | None, live: str | None, evaluation: str | None = None
) -> dict[str, tuple[str, ...]]:
    roles: dict[str, tuple[str, ...]] = {}
    runs = ((run_id, reads.own), (previous, reads.previous), (live, reads.live), (evaluation, reads.kept))
    for run, names in (*runs, *reads.named):
        if run:
            roles[run] = roles.get(run, ()) + names
    return roles


def stage(store: ObjectStore, scratch: Path, run_id: str | None, reads: Reads = NIGHT) -> Snapshot:
    """Download into `scratch` what `reads` names; every other object of a run folder is an empty placeholder
    (so listings, `previous_run` and retention see the store as it is; a step that read one would fail on it)."""
    snap = Snapshot()
    keys = store.listing("runs/")
    live = store.get(LIVE)
    snap.live = live.decode().strip() if live else None
    if snap.live:
        local_path(scratch / rf.RUNS, snap.live)  # a run id: the steps make it a folder name
        (scratch / LIVE).write_text(snap.live + "\n", encoding="utf-8")
    roles = roles_of(reads, run_id, previous_of(keys, run_id), snap.live, earlier_evaluation_of(keys, run_id))
    snap.runs = {r for k in keys if (r := run_of(k))}
    paths = {key: local_path(scratch, key) for key in sorted(keys)}  # every key checked before any is written
    cache = segments.default_cache()

    def stage_one(key: str, path: Path) -> str:
        """Stage `key` as `path`; its sha256."""
        if reads.shard and key == f"runs/{run_id}/{reads.shard[0]}":
            span = functools.partial(shard_range, shard=reads.shard[1], shards=reads.shard[2])
            known = segments.download_rows(store, key, path, span)
        elif wanted(key, reads, roles):
            known = segments.download(store, key, path, cache)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(b"")
            known = None
        return known or sha256_path(path)

    # side by side: a GET waits on the store, a rebuild encodes outside the GIL (a task staging three tables
    # rebuilt from segments waited for each in turn)
    with ThreadPoolExecutor(STAGE_THREADS) as pool:
        staged = dict(zip(paths, pool.map(stage_one, paths, paths.values())))
    for key, path in paths.items():
        snap.sha256[key] = staged[key]
        snap.stat[key] = stat_of(path)
    records = [json.loads(store.get(k)) for k in sorted(store.listing(PROMOTIONS_PREFIX))]
    for record in records:
        promotions.append_record(record, scratch / promotions.PROMOTIONS_LOG)
    snap.records = {record_key(r) for r in records}
    if reads.check_log:
        scorings = [json.loads(store.get(k)) for k in sorted(store.listing(CHECK_SCORINGS_PREFIX))]
        for scoring in scorings:
            check_log.append(scratch / check_log.LOG, scoring)
        snap.scorings = len(check_log.read(scratch / check_log.LOG))
    return snap


def stat_of(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def unchanged(scratch: Path, key: str, snap: Snapshot) -> bool:
    """Is the local file at `key` the one staged? The steps replace a file to change it, so a file with the size
    and modification time it was staged with is not hashed again (a 208 MB input: 0.15 s a task)."""
    if key not in snap.sha256:
        return False
    path = scratch / key
    return snap.stat.get(key) == stat_of(path) or snap.sha256[key] == sha256_path(path)


def scoring_key(record: dict) -> str:
    """One object per (run, design): a rerun of a night's gate under the same design is the same look."""
    return f"{CHECK_SCORINGS_PREFIX}{record['run']}-{record['design_sha256'].removeprefix('sha256:')[:16]}.json"


def record_key(record: dict) -> str:
    body = json.dumps(record, sort_keys=True, ensure_ascii=False).encode()
    return f"{PROMOTIONS_PREFIX}{record['time']}-{hashlib.sha256(body).hexdigest()[:16]}.json"


def local_files(scratch: Path) -> list[str]:
    runs = scratch / rf.RUNS
    found = [p.relative_to(scratch).as_posix() for p in runs.rglob("*") if p.is_file()] if runs.is_dir() else []
    return sorted(k for k in found if not Path(k).name.startswith(".") and ".tmp" not in k)


def publish(store: ObjectStore, scratch: Path, snap: Snapshot, check=lambda: None) -> None:
    """Write back what the steps changed: run files (manifests last), LIVE, new promotion records and scorings,
    removals.
    `check` (lock.fence) raises when this writer no longer holds the lock: it runs before each phase."""
    live_file = scratch / LIVE
    live = live_file.read_text(encoding="utf-8").strip() if live_file.exists() else None
    moves_live = bool(live) and live != snap.live
    with store_errors(store, "publishing", live_changed=False):
        check()
        if moves_live:
            live_unmoved(store, snap, live)
        remote = store.listing("runs/")
        complete = {run_of(k) for k in remote if k.endswith("/index/manifest.json")}
        changed = [k for k in local_files(scratch) if not unchanged(scratch, k, snap)]
        manifests = [k for k in changed if k.endswith("/index/manifest.json")]
        shared = SharedRows(store, remote, snap.live)
        for key in [k for k in changed if k not in manifests] + manifests:
            if manifests and key == manifests[0]:
                check()  # a version becomes complete only under a lease that still holds
            if key.split("/", 2)[2].startswith(INDEX_FILES) and run_of(key) in complete:
                # G1: a complete version's files never change
                store.upload_once(scratch / key, key, shared.upload, functools.partial(segments.file_sha256, store))
            else:
                shared.upload(scratch / key, key)
        check()
        if moves_live:
            live_unmoved(store, snap, live)
        decision = scratch / PUBLISHED_DECISION  # never staged: present only when this task promoted or rolled back
        if decision.is_file():  # before LIVE moves, so a reader of LIVE finds the decision it serves
            store.put(PUBLISHED_DECISION, decision.read_bytes())
        if moves_live:
            store.put(LIVE, (live + "\n").encode())
    with store_errors(store, "writing the promotions and check-set logs", live_changed=moves_live):
        # after LIVE, as in a local artifacts folder: a record never claims a promotion that did not happen (rollback
        # and retention trust the log); one lost to a failure here is written by promote's retry (finish_promotion)
        for record in promotions.read_records(scratch / promotions.PROMOTIONS_LOG):
            if (key := record_key(record)) not in snap.records:  # by content: a count shifts on a misread line
                store.put_once(key, json.dumps(record, sort_keys=True, ensure_ascii=False).encode())
        for scoring in check_log.read(scratch / check_log.LOG)[snap.scorings :]:
            store.put_once(scoring_key(scoring), json.dumps(scoring, sort_keys=True).encode())
    with store_errors(store, "removing the run folders retention dropped", live_changed=live != snap.live):
        runs = scratch / rf.RUNS
        # no runs folder at all: nothing was staged there, so nothing was dropped
        dropped = sorted(snap.runs - {p.name for p in runs.iterdir() if p.is_dir()}) if runs.is_dir() else []
        if dropped:
            check()
        for run in dropped:
            store.delete_prefix(f"runs/{run}/")
        if dropped:
            segments.collect(store, check)  # the rows only the dropped runs held


class SharedRows:
    """Publishes a run's large tables and arrays as pointers to segments of rows (versions/segments.py), sharing
    the rows they have in common with the run's other files and the previous and live runs' files."""

    def __init__(self, store: ObjectStore, remote: dict[str, int], live: str | None):
        self.store, self.keys, self.live = store, dict(remote), live
        self.cache = segments.default_cache()
        self.pointers: dict[str, segments.Pointer | None] = {}

    def pointer(self, key: str) -> segments.Pointer | None:
        if key not in self.pointers:
            small = self.keys.get(key, 0) <= segments.POINTER_LIMIT
            self.pointers[key] = segments.read_pointer(self.store, key) if small else None
        return self.pointers[key]

    def related(self, key: str) -> list[segments.Pointer]:
        run = run_of(key)
        runs = {run, previous_of(self.keys, run), self.live} - {None}
        keys = sorted(k for k in self.keys if run_of(k) in runs and segments.kind_of(k))
        return [p for k in keys if (p := self.pointer(k))]

    def upload(self, path: Path, key: str) -> None:
        # publish runs on a staged scratch folder, removed right after: its files can be linked into the cache
        pointer = segments.upload(self.store, path, key, self.related(key), self.cache, link=True)
        self.keys[key] = len(pointer.to_bytes()) if pointer else path.stat().st_size
        self.pointers[key] = pointer


def live_unmoved(store: ObjectStore, snap: Snapshot, live: str) -> None:
    """Refuse to write LIVE unless the store still holds the LIVE this writer staged (and judged against)."""
    data = store.get(LIVE)
    current = data.decode().strip() if data else None
    if current != snap.live:
        raise LiveMoved(
            f"{store.url(LIVE)} is {current!r}, not {snap.live!r} as staged: another writer promoted meanwhile; "
            f"{live!r} was not promoted (LIVE and the promotions log left as they are)"
        )


@contextmanager
def store_errors(store: ObjectStore, doing: str, live_changed: bool) -> Iterator[None]:
    """A failed store request (pyarrow raises OSError) as one error naming the store, the phase and LIVE's fate."""
    try:
        yield
    except OSError as exc:
        fate = f"LIVE {'was' if live_changed else 'was not'} changed"
        raise StoreUnavailable(f"object store {store.uri} failed while {doing}: {exc}; {fate}") from exc


@contextmanager
def staged(
    cfg: PipelineConfig, run_id: str | None = None, reads: Reads = NIGHT, publish_after: bool = True
) -> Iterator[Path]:
    """The local artifacts folder the steps work in: `cfg.artifacts` itself when it is a folder; for an s3:// prefix
    a scratch folder staged from it, published on success (a read-only command: `publish_after=False`). The config
    is never rewritten: it names where runs are published, the folder where they are worked on."""
    if not is_remote(cfg.artifacts):
        yield Path(cfg.artifacts)
        return
    store = ObjectStore.from_uri(cfg.artifacts)
    scratch = Path(tempfile.mkdtemp(prefix="sourcegate-stage-"))
    (scratch / PUBLISHED_AS).write_text(store.uri, encoding="utf-8")
    try:
        with store_errors(store, "staging", live_changed=False):
            snap = stage(store, scratch, run_id, reads)
        yield scratch
        if publish_after:
            publish(store, scratch, snap, fence(cfg))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@contextmanager
def locked_staged(
    cfg: PipelineConfig, command: str, run_id: str | None, reads: Reads, shared: bool = False
) -> Iterator[Path]:
    """A writer on an s3:// artifacts prefix: under the lock object, `reads` staged into its own scratch folder,
    published after it returns, the scratch removed. A local artifacts folder: that folder (the steps lock it)."""
    if not is_remote(cfg.artifacts):
        yield Path(cfg.artifacts)
        return
    with writer_lock(cfg, command, shared=shared), staged(cfg, run_id, reads) as local:
        yield local


def task_staged(
    cfg: PipelineConfig, step: str, run_id: str, shard: tuple[int, int] | None = None
) -> ContextManager[Path]:
    """One DAG task: only what `step` reads (STEP_READS); an embed `shard` (shard, shards) only its slice of
    chunks.text.parquet. Embed shards share the lock: each publishes only its own shard file. A READ_ONLY step
    takes no lock and publishes nothing."""
    reads = STEP_READS[step]
    if shard is not None:
        reads = replace(reads, shard=(rf.CHUNKS_TEXT, *shard))
    if step in READ_ONLY:
        return staged(cfg, run_id, reads, publish_after=False)
    return locked_staged(cfg, f"{command_line()} [{step}]", run_id, reads, shared=step == "embed")
