"""Render the Helm chart (deploy/helm/smolgate) for every shipped value set and validate every document, offline.

    python -m deploy.chart                 # -> build/chart/<values-name>.yaml, one multi-document YAML each

Rendering runs Helm's own Go engine (the Helm v4 SDK, through the `helm-python-sdk` wheel, which bundles it as a
shared library: no helm binary, no network), values.schema.json included, after `helm lint --strict`. Each
document is then checked by tools that share no code with Helm: the built-in kinds against the Kubernetes JSON
schemas `kubernetes-validate` bundles (strict: unknown fields are errors), at the oldest and newest Kubernetes
versions the chart supports; the KEDA ScaledObject and the ServiceMonitor against the openAPIV3Schema of their
CRDs, vendored in deploy/schemas/ (source and version in each file's header), with unknown fields refused too.
The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "smolgate"
EXAMPLES = CHART / "examples"
SCHEMAS = ROOT / "deploy" / "schemas"
RELEASE, NAMESPACE = "smolgate", "smolgate"
# The chart's kubeVersion floor, and the newest schemas kubernetes-validate ships
KUBE_VERSIONS = ("1.27.0", "1.37.0")
CRDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "keda.sh_scaledobjects.yaml",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "monitoring.coreos.com_servicemonitors.yaml",
}


@dataclass
class Rendered:
    name: str  # the value set's name (examples/<name>.yaml)
    documents: list[dict[str, Any]]
    errors: list[str] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [d for d in self.documents if d["kind"] == kind]

    def one(self, kind: str, suffix: str = "") -> dict[str, Any]:
        found = [d for d in self.of_kind(kind) if d["metadata"]["name"].endswith(suffix)]
        if len(found) != 1:
            raise LookupError(f"{self.name}: {len(found)} {kind} named *{suffix}")
        return found[0]


def value_sets() -> dict[str, Path]:
    return {p.stem: p for p in sorted(EXAMPLES.glob("*.yaml"))}


def render(values: dict[str, Any], name: str = "values") -> Rendered:
    """The chart's documents for these values (Helm's engine; values.schema.json applies)."""
    import helm_python as helm

    with helm.Chart.load(str(CHART)) as chart:
        manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    docs = []
    for template in sorted(manifests):
        if not template.endswith(".yaml"):
            continue  # NOTES.txt
        docs += [d for d in yaml.safe_load_all(manifests[template]) if d]
    return Rendered(name, docs)


def _strict(schema: Any) -> Any:
    """A CRD schema that refuses unknown fields, as kubeconform's strict mode does (the API server would prune them
    silently): additionalProperties false on every object that lists its properties and keeps no unknown fields."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        keeps_unknown = "additionalProperties" in schema or schema.get("x-kubernetes-preserve-unknown-fields")
        if "properties" in schema and not keeps_unknown:
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


def crd_schema(api_version: str, kind: str) -> dict[str, Any]:
    crd = yaml.safe_load((SCHEMAS / CRDS[(api_version, kind)]).read_text())
    version = api_version.split("/")[1]
    spec = next(v for v in crd["spec"]["versions"] if v["name"] == version)
    return _strict(spec["schema"]["openAPIV3Schema"])


def validate(doc: dict[str, Any]) -> Iterator[str]:
    """Each problem with one document, as `Kind/name: message`."""
    import jsonschema
    import kubernetes_validate

    where = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
    key = (doc.get("apiVersion"), doc.get("kind"))
    if key in CRDS:
        validator = jsonschema.Draft7Validator(crd_schema(*key))  # type: ignore[arg-type]
        for err in validator.iter_errors(doc):
            yield f"{where}: {'/'.join(map(str, err.absolute_path))}: {err.message}"
        return
    for version in KUBE_VERSIONS:
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            yield f"{where} (Kubernetes {version}): {'/'.join(map(str, exc.path))}: {exc.message}"
        except kubernetes_validate.SchemaNotFoundError as exc:
            yield f"{where} (Kubernetes {version}): no schema for {key}: {exc}"


def lint(values: dict[str, Any]) -> list[str]:
    """`helm lint --strict` of the chart with these values: its warnings and errors (its advice, such as
    "icon is recommended", is not a problem)."""
    import helm_python as helm

    report = helm.lint(str(CHART), values=values, strict=True, namespace=NAMESPACE, kube_version=KUBE_VERSIONS[0])
    return [f"helm lint: {m['path']}: {m['error'].strip()}" for m in report["messages"] if m["severity"] >= 2]


def render_all(out: Path) -> list[Rendered]:
    """Every shipped value set linted, rendered into out/<name>.yaml and validated; problems are in Rendered.errors."""
    out.mkdir(parents=True, exist_ok=True)
    results = []
    for name, path in value_sets().items():
        values = yaml.safe_load(path.read_text()) or {}
        rendered = render(values, name)
        rendered.errors = lint(values) + [e for d in rendered.documents for e in validate(d)]
        (out / f"{name}.yaml").write_text(yaml.safe_dump_all(rendered.documents, sort_keys=False))
        results.append(rendered)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m deploy.chart", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "chart")
    args = parser.parse_args(argv)
    results = render_all(args.out)
    for r in results:
        kinds = sorted({d["kind"] for d in r.documents})
        print(f"{args.out / r.name}.yaml: {len(r.documents)} documents ({', '.join(kinds)})", file=sys.stderr)
        for e in r.errors:
            print(f"  INVALID {e}", file=sys.stderr)
    summary = {r.name: {"documents": len(r.documents), "errors": len(r.errors)} for r in results}
    print(json.dumps({"chart": str(CHART.relative_to(ROOT)), "kubernetes": list(KUBE_VERSIONS), "value_sets": summary}))
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
