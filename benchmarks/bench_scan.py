"""Benchmark: scanning a survey from a local folder and from an S3 endpoint on loopback.

Prints images per second and bytes read per image of ``scan_images`` for seneca_1200 (167 JPEG,
51.8 MB) read from ``../shared/data`` and from a moto ``ThreadedMotoServer`` on 127.0.0.1, and
of the named baseline run in the same process: read every file whole and parse it with Pillow
(``Image.open(BytesIO(data)).getexif()``), the naive way to get EXIF. Locally our scan also
hashes every file (sha256 identity), so its metadata bytes and its identity bytes are shown
apart; on S3 the identity is the ETag (no full read).

Usage: python benchmarks/bench_scan.py [--survey seneca_1200] [--workers 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import io
import os
import socket
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from PIL import Image

from prefect_odm.survey.scan import scan_images_with_stats

DATA = Path(__file__).resolve().parents[1] / ".." / "shared" / "data"


def naive_scan(paths: list[Path], read_whole, workers: int) -> tuple[float, int]:
    """Baseline: whole-file read + Pillow EXIF; returns (seconds, bytes read)."""

    def one(p):
        data = read_whole(p)
        exif = Image.open(io.BytesIO(data)).getexif()
        exif.get_ifd(0x8825)
        return len(data)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        total = sum(pool.map(one, paths))
    return time.perf_counter() - t0, total


def best_of(repeat: int, fn):
    best = None
    for _ in range(repeat):
        out = fn()
        if best is None or out[0] < best[0]:
            best = out
    return best


def decode_cost(args: argparse.Namespace, n: int, t_scan: float, ours_local) -> None:
    """The whole-image decode's share of a first scan: the same scan with the decode skipped
    (the named baseline, same process), and a repeat that the identity cache answers."""
    import prefect_odm.survey.local_scan as local_scan

    real = local_scan.decode_whole
    local_scan.decode_whole = lambda res, path, *data: None
    try:
        t_skip, _ = best_of(args.repeat, lambda: ours_local(False))
    finally:
        local_scan.decode_whole = real
    print(
        f"local  decode whole: first scan {t_scan:.2f} s, the same without decoding {t_skip:.2f} s"
        f" (baseline): decode {1000 * (t_scan - t_skip) / n:.1f} ms/image, ratio"
        f" {t_scan / t_skip:.2f}x; a repeat decodes nothing (identity cache, line above)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--survey", default="seneca_1200")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    folder = (DATA / args.survey / "images").resolve()
    paths = sorted(p for p in folder.iterdir() if p.is_file())
    n = len(paths)

    def ours_local(cache: bool):
        survey, stats = scan_images_with_stats(
            str(folder), max_workers=args.workers, use_identity_cache=cache
        )
        return stats.seconds, stats

    t, stats = best_of(args.repeat, lambda: ours_local(False))
    print(f"{args.survey}: {n} images, {sum(p.stat().st_size for p in paths) / 1e6:.1f} MB")
    print(
        f"local  ours : {n / t:8.0f} images/s  "
        f"metadata {stats.metadata_bytes / n / 1024:6.1f} KiB/image"
        f"  + sha256 identity {stats.identity_bytes / n / 1024:6.1f} KiB/image"
    )
    with tempfile.TemporaryDirectory() as home:
        os.environ["PREFECT_ODM_HOME"] = home
        ours_local(True)  # fills the identity cache
        tc, cstats = best_of(args.repeat, lambda: ours_local(True))
    print(
        f"local  ours, unchanged images (identity cache): {n / tc:8.0f} images/s  "
        f"identity {cstats.identity_bytes / n / 1024:6.1f} KiB/image; "
        f"ratio to the hashing scan {t / tc:.2f}x"
    )
    decode_cost(args, n, t, ours_local)  # no identity cache in these runs
    tb, nb = best_of(args.repeat, lambda: naive_scan(paths, Path.read_bytes, args.workers))
    print(
        f"local  naive: {n / tb:8.0f} images/s  "
        f"{nb / n / 1024:6.1f} KiB/image (whole file + Pillow)"
    )
    print(f"local  ratio ours/naive images per second = {tb / t:.2f}x")

    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        import boto3

        endpoint = f"http://127.0.0.1:{port}"
        creds = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing"}
        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", **creds)
        client.create_bucket(Bucket="bench")
        for p in paths:
            client.upload_file(str(p), "bench", f"{args.survey}/{p.name}")
        options = {"endpoint_url": endpoint, "key": "testing", "secret": "testing"}

        def ours_s3():
            survey, st = scan_images_with_stats(
                f"s3://bench/{args.survey}", storage_options=options, max_workers=args.workers
            )
            assert len(survey.images) == n
            return st.seconds, st

        t3, st3 = best_of(args.repeat, ours_s3)
        print(
            f"s3     ours : {n / t3:8.0f} images/s  "
            f"{(st3.metadata_bytes + st3.identity_bytes) / n / 1024:6.1f} KiB/image"
            f" (ranged GETs; ETag identity)"
        )

        def get(p: Path) -> bytes:
            return client.get_object(Bucket="bench", Key=f"{args.survey}/{p.name}")["Body"].read()

        tb3, nb3 = best_of(args.repeat, lambda: naive_scan(paths, get, args.workers))
        print(
            f"s3     naive: {n / tb3:8.0f} images/s  "
            f"{nb3 / n / 1024:6.1f} KiB/image (whole object + Pillow)"
        )
        print(
            f"s3     ratio ours/naive images per second = {tb3 / t3:.2f}x; "
            f"bytes ratio naive/ours = "
            f"{nb3 / (st3.metadata_bytes + st3.identity_bytes):.1f}x"
        )
    finally:
        server.stop()


if __name__ == "__main__":
    main()
