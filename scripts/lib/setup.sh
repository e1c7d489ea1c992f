# Shared by scripts/test, scripts/demo and scripts/libfabric-build: install what a fresh
# Debian/Ubuntu machine lacks.

# The system packages the build needs: libfabric's headers and library, its tools (fi_info),
# libclang for bindgen, and pkg-config to find them.
PACKAGES=(libfabric-dev libfabric-bin libclang-dev pkg-config iproute2 nftables)

# What building libfabric from its git source needs (scripts/libfabric-build): the autotools for
# autogen.sh, and the verbs and rdma-cm headers without which configure leaves out the efa and
# verbs providers.
LIBFABRIC_BUILD_PACKAGES=(autoconf automake libtool make gcc libibverbs-dev librdmacm-dev)

# Install every named Debian package that is not installed yet (none: the default PACKAGES).
ensure_system_packages() {
    local wanted=("$@")
    [ ${#wanted[@]} -eq 0 ] && wanted=("${PACKAGES[@]}")
    local missing=()
    for package in "${wanted[@]}"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "==> installing ${missing[*]}"
    local sudo=()
    if [ "$(id -u)" -ne 0 ]; then
        if command -v sudo >/dev/null 2>&1; then
            sudo=(sudo)
        else
            echo "not root and no sudo: run 'apt-get update && apt-get install -y ${missing[*]}' as root, then run this again" >&2
            exit 1
        fi
    fi
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${missing[@]}"
}

ensure_rust() {
    if ! command -v cargo >/dev/null 2>&1; then
        echo "cargo is missing: install Rust with rustup (https://rustup.rs), then run this again" >&2
        exit 1
    fi
}
