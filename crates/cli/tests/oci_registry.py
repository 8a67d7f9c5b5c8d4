#!/usr/bin/env python3
"""A small OCI registry (distribution API v2, pulls only) for the `--oci` tests.

usage: oci_registry.py --info FILE --name NAME --tag TAG
                       [--layer PLATFORM=FILE ...] [--auth USER:PASS] [--redirect]
                       [--corrupt-blob] [--flaky N] [--flaky-manifests N]
       oci_registry.py --name NAME --tag TAG --layer ... --layout DIR
       oci_registry.py --name NAME --tag TAG --layer ... --docker-archive FILE [--docker-legacy]

Serves an image index for TAG with one manifest per PLATFORM (os/arch) whose layers are
the FILEs given for it, in order (media type from the name: .gz tar+gzip, .zst
tar+zstd, else tar), plus an attestation-like entry (platform unknown/unknown). With
--auth, every /v2/ request needs a bearer token, which /token hands out for the HTTP
Basic credentials USER:PASS (Docker Hub's flow). With --redirect, blobs answer 307 to
/cdn/DIGEST (served without auth). With --corrupt-blob, the first byte of every layer
is flipped as it is served. With --flaky N, the first N blob requests answer 503;
with --flaky-manifests N, the first N manifest requests answer 429 (a rate limit). Binds 127.0.0.1 on a free port, then writes FILE (JSON:
port, manifest digests by platform, layer digests). With --layout or --docker-archive
it writes the image to disk instead (an OCI layout whose index.json names the image
index TAG; `docker save`'s archive of the first platform's image) and exits.
"""
import argparse
import base64
import hashlib
import json
import os
import secrets
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--info")
p.add_argument("--name", required=True)
p.add_argument("--tag", required=True)
p.add_argument("--layer", action="append", default=[])
p.add_argument("--auth")
p.add_argument("--redirect", action="store_true")
p.add_argument("--corrupt-blob", action="store_true")
p.add_argument("--flaky", type=int, default=0)
p.add_argument("--flaky-manifests", type=int, default=0)
p.add_argument("--layout", help="write an OCI image layout to this directory and exit")
p.add_argument("--docker-archive", help="write a docker save archive (first platform) and exit")
p.add_argument("--docker-legacy", action="store_true",
               help="with --docker-archive: layers as N/layer.tar, as Docker before 25")
args = p.parse_args()

blobs = {}  # digest -> (media type, bytes)
layer_digests = set()


def put(mt, data):
    d = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[d] = (mt, data)
    return d


platforms = {}
for spec in args.layer:
    plat, _, path = spec.partition("=")
    platforms.setdefault(plat, []).append(path)

index_entries = []
manifest_digests = {}
info_layers = {}
for plat, files in platforms.items():
    os_, arch = plat.split("/")[:2]
    layers = []
    for f in files:
        data = open(f, "rb").read()
        mt = "application/vnd.oci.image.layer.v1.tar"
        if f.endswith(".gz"):
            mt += "+gzip"
        elif f.endswith(".zst"):
            mt += "+zstd"
        d = put(mt, data)
        layer_digests.add(d)
        layers.append({"mediaType": mt, "digest": d, "size": len(data)})
    info_layers[plat] = [l["digest"] for l in layers]
    config = json.dumps({"architecture": arch, "os": os_,
                         "rootfs": {"type": "layers", "diff_ids": []}}).encode()
    cmt = "application/vnd.oci.image.config.v1+json"
    cd = put(cmt, config)
    manifest = json.dumps({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": cmt, "digest": cd, "size": len(config)},
        "layers": layers,
    }).encode()
    mmt = "application/vnd.oci.image.manifest.v1+json"
    md = put(mmt, manifest)
    manifest_digests[plat] = md
    index_entries.append({"mediaType": mmt, "digest": md, "size": len(manifest),
                          "platform": {"os": os_, "architecture": arch}})
# An attestation manifest, as BuildKit adds: no platform of its own.
att = json.dumps({"schemaVersion": 2, "layers": []}).encode()
ad = put("application/vnd.oci.image.manifest.v1+json", att)
index_entries.append({"mediaType": "application/vnd.oci.image.manifest.v1+json",
                      "digest": ad, "size": len(att),
                      "platform": {"os": "unknown", "architecture": "unknown"}})
index = json.dumps({"schemaVersion": 2,
                    "mediaType": "application/vnd.oci.image.index.v1+json",
                    "manifests": index_entries}).encode()
imt = "application/vnd.oci.image.index.v1+json"
index_digest = put(imt, index)
tags = {args.tag: index_digest}

if args.layout:
    os.makedirs(os.path.join(args.layout, "blobs", "sha256"), exist_ok=True)
    for d, (mt, data) in blobs.items():
        with open(os.path.join(args.layout, "blobs", "sha256", d[len("sha256:"):]), "wb") as f:
            f.write(data)
    with open(os.path.join(args.layout, "oci-layout"), "w") as f:
        json.dump({"imageLayoutVersion": "1.0.0"}, f)
    with open(os.path.join(args.layout, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [
            {"mediaType": imt, "digest": index_digest, "size": len(index),
             "annotations": {"org.opencontainers.image.ref.name": args.tag}}]}, f)
    sys.exit(0)
if args.docker_archive:
    import io
    import tarfile
    plat = next(iter(platforms))
    md = manifest_digests[plat]
    man = json.loads(blobs[md][1])
    members = {}
    if args.docker_legacy:
        paths = [f"{i}/layer.tar" for i in range(len(man["layers"]))]
    else:
        paths = ["blobs/sha256/" + l["digest"][len("sha256:"):] for l in man["layers"]]
    for pth, l in zip(paths, man["layers"]):
        members[pth] = blobs[l["digest"]][1]
    cfg = "blobs/sha256/" + man["config"]["digest"][len("sha256:"):]
    members[cfg] = blobs[man["config"]["digest"]][1]
    members["manifest.json"] = json.dumps([{"Config": cfg, "RepoTags": [f"{args.name}:{args.tag}"],
                                            "Layers": paths}]).encode()
    with tarfile.open(args.docker_archive, "w", format=tarfile.PAX_FORMAT) as t:
        for name in sorted(members):
            ti = tarfile.TarInfo(name)
            ti.size = len(members[name])
            t.addfile(ti, io.BytesIO(members[name]))
    sys.exit(0)
token = secrets.token_hex(16)
flaky = {"left": args.flaky, "manifests": args.flaky_manifests}
flaky_lock = threading.Lock()


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, code, body=b"", headers=()):
        self.send_response(code)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def blob(self, digest):
        mt, data = blobs[digest]
        if args.corrupt_blob and digest in layer_digests:
            data = bytes([data[0] ^ 0xFF]) + data[1:]
        self.send(200, data, [("Content-Type", mt), ("Docker-Content-Digest", digest)])

    def do_GET(self):
        path = self.path.split("?")[0]
        if path == "/token":
            want = "Basic " + base64.b64encode(args.auth.encode()).decode() if args.auth else None
            if want and self.headers.get("Authorization") != want:
                return self.send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}')
            return self.send(200, json.dumps({"token": token}).encode(),
                             [("Content-Type", "application/json")])
        if path.startswith("/cdn/"):
            d = path[len("/cdn/"):]
            return self.blob(d) if d in blobs else self.send(404)
        if not path.startswith("/v2/"):
            return self.send(404)
        if args.auth and self.headers.get("Authorization") != "Bearer " + token:
            host = self.headers.get("Host")
            chal = (f'Bearer realm="http://{host}/token",service="test-registry",'
                    f'scope="repository:{args.name}:pull"')
            return self.send(401, b'{"errors":[{"code":"UNAUTHORIZED"}]}',
                             [("WWW-Authenticate", chal)])
        prefix = f"/v2/{args.name}/"
        if path == "/v2/":
            return self.send(200, b"{}")
        if not path.startswith(prefix):
            return self.send(404)
        kind, _, ref = path[len(prefix):].partition("/")
        if kind == "manifests":
            with flaky_lock:
                busy = flaky["manifests"] > 0
                flaky["manifests"] -= busy
            if busy:
                return self.send(429, b"slow down")
            d = tags.get(ref, ref)
            if d not in blobs:
                return self.send(404)
            mt, data = blobs[d]
            return self.send(200, data, [("Content-Type", mt), ("Docker-Content-Digest", d)])
        if kind == "blobs":
            if ref not in blobs:
                return self.send(404)
            with flaky_lock:
                busy = flaky["left"] > 0
                flaky["left"] -= busy
            if busy:
                return self.send(503, b"busy")
            if args.redirect:
                return self.send(307, b"", [("Location", f"/cdn/{ref}")])
            return self.blob(ref)
        return self.send(404)


srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
tmp = args.info + ".tmp"
with open(tmp, "w") as f:
    json.dump({"port": srv.server_address[1], "index": index_digest,
               "manifests": manifest_digests, "layers": info_layers}, f)
os.rename(tmp, args.info)
sys.stdout.flush()
srv.serve_forever()
