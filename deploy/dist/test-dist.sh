#!/usr/bin/env bash
# make test-dist: test what `make dist` made in $DIST_DIR (docs/deploy.md,
# "On one host"). Run by the Makefile from the repository root, after
# `make dist`, with GO, DIST_DIR, DIST_ARCHS, DIST_OLD_REF, GOTAGS and RACE set.
set -euo pipefail
GO=${GO:-go}
tags=()
if [ -n "${GOTAGS:-}" ]; then tags=(-tags "$GOTAGS"); fi
arch=$($GO env GOARCH)
deb=$(ls "$DIST_DIR"/grasp-sync_*_"$arch".deb)
tmp=$(mktemp -d)
cleanup() {
	if [ -n "${oldwt:-}" ]; then git worktree remove --force "$oldwt" >/dev/null 2>&1 || true; fi
	if [ -n "${reprowt:-}" ]; then git worktree remove --force "$reprowt" >/dev/null 2>&1 || true; fi
	rm -rf "$tmp"
}
trap cleanup EXIT

echo "== deploy/dist: the unit's hardening, the archive writer"
if out=$(gofmt -l deploy/dist) && [ -n "$out" ]; then echo "gofmt needed:"; echo "$out"; exit 1; fi
(cd deploy/dist && GOWORK=off $GO vet ./... && GOWORK=off $GO test -count=1 ./...)

# systemd-analyze comes with Debian's systemd package.
if ! command -v systemd-analyze >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "== installing systemd (for systemd-analyze)"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q systemd >/dev/null 2>&1 ||
		{ apt-get update -q >/dev/null 2>&1 && DEBIAN_FRONTEND=noninteractive apt-get install -y -q systemd >/dev/null; }
fi
echo "== systemd-analyze verify: the unit as installed from $(basename "$deb")"
# The package unpacked into a throwaway root, plus the host's own units
# (sysinit.target and the rest the unit depends on), so verify resolves
# ExecStart in the packaged tree. Any warning fails, not only errors.
root=$tmp/root
dpkg-deb -x "$deb" "$root"
mkdir -p "$root/usr/lib/systemd"
cp -a /usr/lib/systemd/system "$root/usr/lib/systemd/"
if ! out=$(systemd-analyze verify --root="$root" graspd.service 2>&1) || [ -n "$out" ]; then
	echo "systemd-analyze verify failed:"; echo "$out"; exit 1
fi
echo "ok: no warnings"
exposure=$(systemd-analyze security --offline=true --root="$root" graspd.service 2>&1 | sed -n 's/.*Overall exposure level for graspd.service: \([0-9.]*\).*/\1/p')
echo "systemd-analyze security: exposure $exposure (0 = fully confined, 10 = unconfined)"
if [ -z "$exposure" ] || ! awk -v e="$exposure" 'BEGIN { exit !(e < 2.0) }'; then
	echo "exposure ${exposure:-unknown}, want under 2.0"; exit 1
fi

echo "== reproducible: the same commit built again elsewhere gives the same bytes"
if [ -n "$(git status --porcelain --untracked-files=no)" ]; then
	echo "skipped: the work tree has uncommitted changes (its binaries say -dirty); commit and run again"
else
	reprowt=$tmp/repro
	git worktree add --detach "$reprowt" HEAD >/dev/null 2>&1
	(cd "$reprowt" && make --no-print-directory dist DIST_DIR="$tmp/repro-dist" DIST_ARCHS="$DIST_ARCHS" >/dev/null)
	if ! diff "$DIST_DIR/SHA256SUMS" "$tmp/repro-dist/SHA256SUMS"; then
		echo "two builds of $(git rev-parse --short HEAD) differ"; exit 1
	fi
	echo "ok: $(wc -l < "$DIST_DIR/SHA256SUMS") files identical (build in $reprowt)"
fi

echo "== the previous version's graspd ($DIST_OLD_REF), for the upgrade test"
oldwt=$tmp/old
git worktree add --detach "$oldwt" "$DIST_OLD_REF" >/dev/null 2>&1
old=$tmp/old-graspd
(cd "$oldwt/services/graspd" && $GO build "${tags[@]}" -ldflags "-X github.com/grasp-sync/grasp-sync/pkg/obs.Version=$DIST_OLD_REF -X github.com/grasp-sync/grasp-sync/pkg/obs.Commit=$(git rev-parse --short "$DIST_OLD_REF")" -o "$old" ./cmd/graspd)

echo "== e2e: the package's contents and env file, the packaged graspd syncing, the upgrade"
(cd e2e && GRASP_DIST_DEB="$deb" GRASP_DIST_OLD_GRASPD="$old" $GO test ${RACE:-} "${tags[@]}" -count=1 -v \
	-run '^(TestPackageContents|TestPackagedEnvFile|TestPackagedGraspdSyncs|TestUpgradeKeepsData)$' .)
