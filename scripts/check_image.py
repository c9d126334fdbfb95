"""The image definition, checked statically for scripts/check-deploy.sh (no Docker here).

The default target (the last stage) is on a distroless or scratch base, runs as a numeric
non-root user, carries the five release binaries and no demo upstream, catalog, configuration
or shell script, and has the OCI labels. The demo upstream has a stage of its own, which
compose builds for its `upstream` service.
"""


def check(fail, ok, compose, compose_path, SERVICES):
    """Checks deploy/Dockerfile and the compose file's use of its targets, reporting each
    problem with `fail(path, message)` and each passed check with `ok(message)`."""
    dockerfile = "deploy/Dockerfile"
    stages = []  # (name, base, [instructions])
    with open(dockerfile) as f:
        logical, line = [], ""
        for raw in f:
            if raw.lstrip().startswith("#") and not line:
                continue
            line += raw.rstrip("\n")
            if line.endswith("\\"):
                line = line[:-1] + " "
                continue
            if line.strip():
                logical.append(line.strip())
            line = ""
    for ins in logical:
        word, _, rest = ins.partition(" ")
        if word.upper() == "FROM":
            parts = rest.split()
            name = parts[2] if len(parts) >= 3 and parts[1].upper() == "AS" else None
            stages.append((name, parts[0], []))
        elif stages:
            stages[-1][2].append((word.upper(), rest.strip()))
    if not stages:
        fail(dockerfile, "no FROM")
    else:
        name, base, body = stages[-1]
        problems = []
        if not (base.startswith("gcr.io/distroless/") or base == "scratch"):
            problems.append(f"the default target's base is {base}, not distroless or scratch")
        users = [rest for word, rest in body if word == "USER"]
        if not users:
            problems.append("no USER in the default target (it would run as root)")
        else:
            uid = users[-1].split(":")[0]
            if not uid.isdigit() or int(uid) == 0:
                problems.append(f"USER {users[-1]} is not a numeric non-root uid (Kubernetes' runAsNonRoot needs a number)")
        copies = " ".join(rest for word, rest in body if word in ("COPY", "ADD"))
        for forbidden in ("sluice-upstream", "catalog", ".toml", "healthcheck", "deploy/"):
            if forbidden in copies:
                problems.append(f"the default target copies {forbidden!r} in ({copies})")
        if any(word == "HEALTHCHECK" and ("bash" in rest or "CMD-SHELL" in rest) for word, rest in body):
            problems.append("a HEALTHCHECK needing a shell, which distroless does not have")
        labels = " ".join(rest for word, rest in body if word == "LABEL")
        for label in ("version", "revision", "source", "licenses"):
            if f"org.opencontainers.image.{label}=" not in labels:
                problems.append(f"no org.opencontainers.image.{label} label")
        if 'org.opencontainers.image.licenses="Apache-2.0"' not in labels:
            problems.append("org.opencontainers.image.licenses is not Apache-2.0 (Cargo.toml's licence)")
        if any(word == "ENV" and "SLUICE_CONFIG" in rest for word, rest in body):
            problems.append("SLUICE_CONFIG set in the image: the configuration is mounted, not baked in")
        builder = next((b for n, _, b in stages if n == "builder"), [])
        built = " ".join(rest for word, rest in builder if word == "RUN")
        for binary in ("sluice", "sluice-producer", "sluice-dispatcher", "sluice-reconciler", "sluice-compensator"):
            if f" {binary} " not in f" {built} ".replace(";", " "):
                problems.append(f"the builder does not install {binary}")
        if problems:
            for problem in problems:
                fail(dockerfile, problem)
        else:
            ok(f"{dockerfile}: default target `{name}` on {base}, user {users[-1]}, the five binaries, "
               "no demo upstream or configuration, OCI labels")
        demo = next(((n, b) for n, _, b in stages if n == "demo"), None)
        if not demo or "sluice-upstream" not in " ".join(rest for word, rest in demo[1] if word == "COPY"):
            fail(dockerfile, "no `demo` stage with the demo upstream (compose's `upstream` builds it)")
        else:
            ok(f"{dockerfile}: the demo upstream is the separate `demo` target")
    if compose:
        services = compose.get("services", {})
        targets = {s: (services.get(s, {}).get("build") or {}).get("target") for s in SERVICES + ["migrate", "upstream"]}
        wrong = {s: t for s, t in targets.items() if t != ("demo" if s == "upstream" else "runtime")}
        if wrong:
            fail(compose_path, f"build targets: the Sluice services need `runtime`, the upstream `demo`; found {wrong}")
        bad_checks = [s for s in SERVICES + ["upstream"]
                      if (services.get(s, {}).get("healthcheck", {}).get("test") or [None, None, None])[1:3] != ["sluice", "health"]]
        if bad_checks:
            fail(compose_path, f"healthchecks of {bad_checks} must run `sluice health URL` (the image has no shell)")
        unmounted = [s for s in SERVICES + ["migrate"]
                     if not any(str(v).endswith(":/etc/sluice/distributed.toml:ro") for v in services.get(s, {}).get("volumes", []))]
        if unmounted:
            fail(compose_path, f"{unmounted} do not mount distributed.toml (the image holds no configuration)")
        if not (wrong or bad_checks or unmounted):
            ok(f"{compose_path}: services on the runtime target with their configuration mounted, the upstream on "
               "the demo target, healthchecks by `sluice health`")

