# Shared set-up for scripts/test, scripts/example and scripts/bench: system packages, database
# servers, and one virtualenv per Django series. Sourced, not run.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

log() { printf '[setup] %s\n' "$*" >&2; }

# An interpreter whose version is at least $1 (e.g. 3.12). pyenv shims for non-global versions fail
# unless told, so pyenv's own version directories are tried too.
find_python() {
    local want=$1 cand
    local cands=(python3.13 python3.12 python3)
    if command -v pyenv >/dev/null 2>&1; then
        for d in "$(pyenv root)"/versions/3.1[0-9]*; do [ -x "$d/bin/python3" ] && cands+=("$d/bin/python3"); done
    fi
    for cand in "${cands[@]}"; do
        if "$cand" -c "import sys; sys.exit(0 if sys.version_info >= tuple(map(int, '$want'.split('.'))) else 1)" >/dev/null 2>&1; then
            command -v "$cand" 2>/dev/null || echo "$cand"
            return 0
        fi
    done
    return 1
}

ensure_system_packages() {
    local need_apt=()
    # mysqlclient compiles against the MariaDB client headers.
    [ -f /usr/include/mariadb/mysql.h ] || [ -f /usr/include/mysql/mysql.h ] || need_apt+=(libmariadb-dev)
    command -v pkg-config >/dev/null || need_apt+=(pkg-config)
    command -v gcc >/dev/null || need_apt+=(gcc)
    # scripts/test: the browser test uses Debian's chromium, the clock tests run workers under
    # libfaketime, the dead-connection tests drop packets with iptables, the pooler tests put
    # PgBouncer in front of PostgreSQL.
    if [ "${1:-}" = test ]; then
        command -v chromium >/dev/null || need_apt+=(chromium)
        ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || need_apt+=(faketime)
        command -v iptables >/dev/null || [ -x /usr/sbin/iptables ] || need_apt+=(iptables)
        [ -x /usr/sbin/pgbouncer ] || need_apt+=(pgbouncer)  # tests/pgbouncer.py
    fi
    # scripts/docs: the built site's screenshots are taken in Debian's chromium.
    if [ "${1:-}" = docs ]; then command -v chromium >/dev/null || need_apt+=(chromium); fi
    if [ "${1:-}" = valgrind ]; then command -v valgrind >/dev/null || need_apt+=(valgrind); fi
    if [ ${#need_apt[@]} -gt 0 ]; then
        if [ "$(id -u)" = 0 ]; then
            log "apt-get install ${need_apt[*]}"
            apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}" >/dev/null
        else
            log "missing system packages: ${need_apt[*]} (install them with apt-get as root)"; return 1
        fi
    fi
}

ensure_postgres() {
    if pg_isready -h 127.0.0.1 -p 5432 -q 2>/dev/null; then return 0; fi
    log "starting PostgreSQL"
    pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start || true
    for _ in $(seq 1 60); do pg_isready -h 127.0.0.1 -p 5432 -q && return 0; sleep 0.5; done
    log "PostgreSQL did not start"; return 1
}

ensure_mariadb() {
    if ! mariadb-admin -h 127.0.0.1 -uroot ping >/dev/null 2>&1; then
        log "starting MariaDB"
        start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd || true
        local up=0
        for _ in $(seq 1 60); do mariadb-admin -h 127.0.0.1 -uroot ping >/dev/null 2>&1 && { up=1; break; }; sleep 0.5; done
        [ $up = 1 ] || { log "MariaDB did not start"; return 1; }
    fi
    # The default 128 MB buffer pool cannot hold a million-row table's indexes (about 410 MB): the
    # EXPLAIN tests' million-row inserts took minutes each on disk reads, and the benchmark's
    # "future jobs" drain would measure them. Production servers give InnoDB most of RAM.
    local pool
    pool=$(mariadb -h 127.0.0.1 -uroot -N -e "SELECT @@innodb_buffer_pool_size" 2>/dev/null || echo 0)
    if [ "${pool:-0}" -lt 1073741824 ]; then
        log "setting MariaDB innodb_buffer_pool_size to 1 GiB (was $pool bytes)"
        mariadb -h 127.0.0.1 -uroot -e "SET GLOBAL innodb_buffer_pool_size = 1073741824" || true
    fi
}

# The supported Django series, one virtualenv each: .venv/dj61 (the newest, where the lint, the
# example, the benchmarks and the loops run), .venv/dj60 and .venv/dj52 (the LTS, on the oldest
# Python the package supports, with the django_tasks backport of django.tasks).
NEWEST=dj61
django_venv() {
    case $1 in
        dj61) make_venv "$ROOT/.venv/dj61" 3.12 "Django>=6.1,<6.2" test ;;
        dj60) make_venv "$ROOT/.venv/dj60" 3.12 "Django>=6.0,<6.1" test ;;
        dj52) make_venv "$ROOT/.venv/dj52" 3.10 "Django>=5.2,<5.3" test tasks ;;
        *) log "unknown Django series $1 (dj61, dj60, dj52)"; return 1 ;;
    esac
}

# make_venv DIR MIN_PYTHON DJANGO_SPEC GROUPS [EXTRAS]: the package, editable, with its EXTRAS
# (comma-separated, e.g. tasks), and the dependency groups GROUPS of pyproject.toml (e.g. test,
# docs), which pip installs from 25.1 on (`pip install --group`).
make_venv() {
    local dir=$1 minpy=$2 django=$3 groups=$4 extras=${5:-} py group
    local stamp="$dir/.rws-stamp" want args=()
    want="$django|$groups|$extras|$(sha1sum "$ROOT/pyproject.toml" | cut -c1-12)"
    if [ -x "$dir/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then return 0; fi
    ensure_system_packages   # the test group's mysqlclient builds against the MariaDB headers
    py=$(find_python "$minpy") || { log "no Python >= $minpy found"; return 1; }
    log "creating $dir with $py ($django)"
    rm -rf "$dir"
    "$py" -m venv "$dir"
    "$dir/bin/python" -m pip install -q --upgrade "pip>=25.1" >/dev/null
    for group in ${groups//,/ }; do args+=(--group "$ROOT/pyproject.toml:$group"); done
    "$dir/bin/python" -m pip install -q "${args[@]}" -e "$ROOT${extras:+[$extras]}" "$django"
    echo "$want" > "$stamp"
}
