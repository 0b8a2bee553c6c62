"""Validates Keel's Kubernetes manifests offline; run through scripts/validate-kubernetes.

    python validate.py [MANIFESTS_DIR]        (default: deploy/kubernetes)

Every YAML document under MANIFESTS_DIR (ci/ aside) is checked:

- built-in kinds against the Kubernetes API schemas that kubernetes-validate ships, in
  strict mode (an unknown field is an error), for each version in KUBERNETES_VERSIONS; a
  kind it has no schema for is an error, not a warning;
- KEDA's kinds (keda.sh) against the `openAPIV3Schema` of KEDA's own CRDs (ci/keda-crds/,
  vendored), made strict the way the API server's strict field validation is: an object
  schema that lists its properties accepts no others. The CRDs' CEL rules
  (x-kubernetes-validations) are evaluated by hand below; a rule this script does not know
  fails the run, so a newer CRD cannot be half-checked in silence;
- each kustomization.yaml lists exactly the YAML files beside it and transforms nothing, so
  what is validated here is what `kubectl apply -k` applies;
- references between the documents: a ScaledObject's target and authentication, a
  Service's, PodDisruptionBudget's and Deployment's selectors, ConfigMaps named by pods.

Exits 1 when anything fails, naming each failure.
"""

import copy
import pathlib
import sys

import jsonschema
import yaml
from kubernetes_validate import utils as kv

# The oldest Kubernetes release the manifests are written for (user namespaces on by
# default, which the worker's unmasked /proc needs) and the newest kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.33.0", "1.37.0")
NAMESPACE = "keel"
CRD_DIR = pathlib.Path(__file__).resolve().parent / "keda-crds"
CLUSTER_SCOPED = {"Namespace"}


def scaled_object_min_max(spec):
    """KEDA's rule: minReplicaCount <= maxReplicaCount (100 when unset)."""
    if "minReplicaCount" not in spec:
        return True
    return spec["minReplicaCount"] <= spec.get("maxReplicaCount", 100)


# The CEL rules of the vendored CRDs, by their exact text, as Python.
CEL_RULES = {
    "!has(self.minReplicaCount) || self.minReplicaCount <= (has(self.maxReplicaCount)"
    " ? self.maxReplicaCount : 100)": scaled_object_min_max,
}

OBJECT_META = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string", "minLength": 1},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "additionalProperties": False,
}


def strict(schema, rules, path="$"):
    """A copy of an openAPIV3Schema in which listed properties are the only ones allowed,
    collecting its CEL rules (with where they apply) into `rules`."""
    schema = copy.copy(schema)
    for rule in schema.pop("x-kubernetes-validations", []):
        rules.append((path, rule))
    if "properties" in schema:
        schema["properties"] = {
            name: strict(sub, rules, f"{path}.{name}") for name, sub in schema["properties"].items()
        }
        if "additionalProperties" not in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            schema["additionalProperties"] = False
    if isinstance(schema.get("items"), dict):
        schema["items"] = strict(schema["items"], rules, f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        schema["additionalProperties"] = strict(schema["additionalProperties"], rules, f"{path}{{}}")
    for key in ("anyOf", "allOf", "oneOf"):
        if key in schema:
            schema[key] = [strict(sub, rules, path) for sub in schema[key]]
    return schema


def load_crds():
    """{(apiVersion, kind): (validator, [(path, rule)])} for every served CRD version."""
    crds = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd:
                continue
            group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
            for version in crd["spec"]["versions"]:
                if not version.get("served"):
                    continue
                rules = []
                schema = strict(version["schema"]["openAPIV3Schema"], rules)
                schema["properties"]["metadata"] = OBJECT_META
                schema["required"] = sorted(set(schema.get("required", [])) | {"metadata", "spec"})
                for rule in rules:
                    if any(mark in rule[0] for mark in "[{"):
                        raise SystemExit(
                            f"{path.name}: {kind} has a CEL rule inside a list or map, which "
                            f"this script cannot place: {rule[0]}: {rule[1]['rule']}"
                        )
                    if rule[1]["rule"] not in CEL_RULES:
                        raise SystemExit(
                            f"{path.name}: {kind} has a CEL rule this script does not evaluate "
                            f"(add it to CEL_RULES): {rule[1]['rule']}"
                        )
                validator = jsonschema.Draft7Validator(schema)
                crds[(f"{group}/{version['name']}", kind)] = (validator, rules)
    return crds


def at(document, path):
    """The value a rule's path ($.spec) names in `document`; only plain fields."""
    value = document
    for part in path.lstrip("$").split(".")[1:]:
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def validate_custom(document, crd, errors, where):
    validator, rules = crd
    for error in sorted(validator.iter_errors(document), key=lambda e: list(e.absolute_path)):
        field = ".".join(str(p) for p in error.absolute_path) or "(document)"
        errors.append(f"{where}: {field}: {error.message}")
    for path, rule in rules:
        value = at(document, path)
        if value is not None and not CEL_RULES[rule["rule"]](value):
            errors.append(f"{where}: {path}: {rule.get('message', rule['rule'])}")


def validate_builtin(document, errors, where):
    for version in KUBERNETES_VERSIONS:
        try:
            kv.validate(document, version, strict=True)
        except kv.ValidationError as error:
            field = ".".join(str(p) for p in error.path) or "(document)"
            errors.append(f"{where}: Kubernetes {version}: {field}: {error.message}")
        except kv.SchemaNotFoundError as error:
            errors.append(f"{where}: {error.message}")


def check_kustomization(path, relative, document, errors):
    beside = sorted(
        p.name for p in path.parent.iterdir() if p.suffix == ".yaml" and p.name != path.name
    )
    listed = document.get("resources", [])
    if sorted(listed) != beside:
        errors.append(f"{relative}: resources {listed} are not the files beside it {beside}")
    extra = set(document) - {"apiVersion", "kind", "resources"}
    if extra:
        errors.append(
            f"{relative}: {sorted(extra)}: this kustomization only lists files, so that what is "
            "validated is what is applied"
        )


def matches(selector, labels):
    return all(labels.get(key) == value for key, value in selector.items())


def check_references(documents, errors):
    by_kind = {}
    for where, document in documents:
        by_kind.setdefault(document["kind"], {})[document["metadata"]["name"]] = (where, document)
    templates = {
        name: doc["spec"]["template"]["metadata"].get("labels", {})
        for kind in ("Deployment", "Job")
        for name, (_, doc) in by_kind.get(kind, {}).items()
    }
    for name, (where, doc) in by_kind.get("Deployment", {}).items():
        if not matches(doc["spec"]["selector"].get("matchLabels", {}), templates[name]):
            errors.append(f"{where}: the selector does not match the pod template's labels")
    for kind, field in (("Service", ("spec", "selector")), ("PodDisruptionBudget", ("spec", "selector", "matchLabels"))):
        for name, (where, doc) in by_kind.get(kind, {}).items():
            selector = doc
            for key in field:
                selector = selector.get(key, {})
            if not any(matches(selector, labels) for labels in templates.values()):
                errors.append(f"{where}: {kind} {name} selects no pod of these manifests")
    for name, (where, doc) in by_kind.get("ScaledObject", {}).items():
        target = doc["spec"]["scaleTargetRef"]
        if target.get("kind", "Deployment") not in by_kind or target["name"] not in by_kind[
            target.get("kind", "Deployment")
        ]:
            errors.append(f"{where}: scaleTargetRef {target} names no document here")
        for trigger in doc["spec"]["triggers"]:
            auth = trigger.get("authenticationRef")
            kind = auth and auth.get("kind", "TriggerAuthentication")
            if auth and auth["name"] not in by_kind.get(kind, {}):
                errors.append(f"{where}: authenticationRef {auth['name']} names no {kind} here")
    config_maps = by_kind.get("ConfigMap", {})
    for kind in ("Deployment", "Job"):
        for name, (where, doc) in by_kind.get(kind, {}).items():
            for container in doc["spec"]["template"]["spec"]["containers"]:
                for source in container.get("envFrom", []):
                    ref = source.get("configMapRef")
                    if ref and not ref.get("optional") and ref["name"] not in config_maps:
                        errors.append(f"{where}: ConfigMap {ref['name']} is not among these manifests")


def main():
    root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "deploy/kubernetes").resolve()
    crds = load_crds()
    errors, documents = [], []
    files = sorted(
        p for p in root.rglob("*.yaml") if "ci" not in p.relative_to(root).parts[:1]
    )
    if not files:
        raise SystemExit(f"no manifests under {root}")
    seen = set()
    for path in files:
        relative = path.relative_to(root)
        try:
            loaded = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        except yaml.YAMLError as error:
            errors.append(f"{relative}: not YAML: {error}")
            continue
        for index, document in enumerate(loaded):
            where = f"{relative}#{index}"
            if not isinstance(document, dict) or not {"apiVersion", "kind"} <= set(document):
                errors.append(f"{where}: not a Kubernetes object (apiVersion and kind)")
                continue
            if document["kind"] == "Kustomization":
                check_kustomization(path, relative, document, errors)
                continue
            name = (document.get("metadata") or {}).get("name")
            if not name:
                errors.append(f"{where}: no metadata.name")
                continue
            where = f"{relative} {document['kind']}/{name}"
            namespace = document["metadata"].get("namespace")
            if document["kind"] in CLUSTER_SCOPED:
                if namespace is not None:
                    errors.append(f"{where}: a {document['kind']} has no namespace")
            elif namespace != NAMESPACE:
                errors.append(f"{where}: namespace is {namespace!r}, not {NAMESPACE!r}")
            key = (document["kind"], namespace, name)
            if key in seen:
                errors.append(f"{where}: defined twice")
            seen.add(key)
            crd = crds.get((document["apiVersion"], document["kind"]))
            if document["apiVersion"].split("/")[0].endswith("keda.sh") and crd is None:
                errors.append(f"{where}: no vendored KEDA CRD serves {document['apiVersion']}")
            elif crd is not None:
                validate_custom(document, crd, errors, where)
            else:
                validate_builtin(document, errors, where)
            documents.append((where, document))
    if not errors:
        check_references(documents, errors)
    for error in errors:
        print(f"FAIL {error}")
    kinds = sorted({d["kind"] for _, d in documents})
    print(
        f"{len(documents)} documents in {len(files)} files ({', '.join(kinds)}); built-in kinds "
        f"against Kubernetes {', '.join(KUBERNETES_VERSIONS)} (strict), KEDA's against its CRDs: "
        f"{len(errors)} failures"
    )
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
