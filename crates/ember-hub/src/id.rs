//! A Hub id: `ORG/NAME[@REVISION][/FILE]`, told from a path by its shape.

/// A Hub reference: the repository, the revision, a file inside the snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct HubId {
    /// The organisation or user.
    pub org: String,
    /// The repository's name.
    pub name: String,
    /// A branch, tag or commit (`main` when not given).
    pub revision: String,
    /// A file inside the snapshot.
    pub file: Option<String>,
}

/// `spec` as a Hub id, when it has the shape of one (`ORG/NAME[@REV][/FILE…]`, names of
/// letters, digits, `-`, `_`, `.`; no absolute or relative path).
pub(crate) fn hub_id(spec: &str) -> Option<HubId> {
    let ok = |s: &str| {
        !s.is_empty()
            && s != "."
            && s != ".."
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let mut parts = spec.split('/');
    let org = parts.next()?;
    let second = parts.next()?;
    let (name, revision) = second.split_once('@').unwrap_or((second, "main"));
    let file: Vec<&str> = parts.collect();
    if !ok(org) || !ok(name) || !ok(revision) || !file.iter().all(|f| ok(f)) {
        return None;
    }
    Some(HubId {
        org: org.into(),
        name: name.into(),
        revision: revision.into(),
        file: (!file.is_empty()).then(|| file.join("/")),
    })
}
