//! User namespaces: which host ids a container's root is mapped to.

/// Why a container's user namespace could not be read.
#[derive(Debug, thiserror::Error)]
pub enum UsernsError {
    #[error("{path}: {op}: {errno}")]
    Host {
        path: String,
        op: &'static str,
        errno: nix::errno::Errno,
    },
    #[error("{0}: the container's root is not mapped")]
    Unmapped(String),
}

/// Host id that a user namespace maps its id 0 to, from `/proc/<pid>/uid_map` text.
pub fn root_mapping(map: &str) -> Option<u32> {
    map.lines().find_map(|l| {
        let f: Vec<u32> = l
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        (f.len() == 3 && f[0] == 0 && f[2] > 0).then_some(f[1])
    })
}

/// Host uid/gid of the root of process `pid` when it runs in a user namespace other than ours.
pub fn root_of(pid: i64) -> Result<Option<(u32, u32)>, UsernsError> {
    let stat = |p: String| {
        nix::sys::stat::stat(p.as_str()).map_err(|errno| UsernsError::Host {
            path: p.clone(),
            op: "stat",
            errno,
        })
    };
    let own = stat("/proc/self/ns/user".into())?;
    let theirs = stat(format!("/proc/{pid}/ns/user"))?;
    if (own.st_dev, own.st_ino) == (theirs.st_dev, theirs.st_ino) {
        return Ok(None);
    }
    let map = |which: &str| -> Result<u32, UsernsError> {
        let p = format!("/proc/{pid}/{which}");
        let text = std::fs::read_to_string(&p).map_err(|e| UsernsError::Host {
            path: p.clone(),
            op: "read",
            errno: nix::errno::Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
        root_mapping(&text).ok_or(UsernsError::Unmapped(p))
    };
    Ok(Some((map("uid_map")?, map("gid_map")?)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_mapping_from_uid_map() {
        assert_eq!(
            root_mapping("         0     200000      65536\n"),
            Some(200000)
        );
        assert_eq!(root_mapping("1000 1000 1\n0 300000 1\n"), Some(300000));
        assert_eq!(root_mapping("1 100000 65536\n"), None);
        assert_eq!(root_mapping("0 5 0\n"), None);
        assert_eq!(root_mapping(""), None);
    }
}
