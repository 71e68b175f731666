//! Downloading a model from the Hugging Face Hub into the cache, laid out as `huggingface_hub`
//! lays it out so that Python tools find it too (the `hub-download` feature): the revision's
//! commit from `/api/models/ORG/NAME/revision/REV`, each file's blob named by its ETag
//! (`blobs/<etag>`, written as `blobs/<etag>.incomplete` and resumed from there with a `Range`
//! request), `snapshots/<commit>/<file>` a relative link to it, `refs/<rev>` the commit.
//!
//! The bytes are checked before a blob is kept: a large (LFS) file's ETag is its SHA-256, and
//! every file's length must match the size the Hub announced. The token (`HF_TOKEN`, else the
//! token file `huggingface-cli login` writes) goes to the Hub's host only, never to the
//! storage host a large file redirects to. `HF_ENDPOINT` names another Hub (a mirror, a test
//! server).

use crate::error::{HubError, Result};
use crate::id::HubId;
use crate::index::shards;
use serde_json::Value;
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// A connection to the Hub.
pub struct Hub {
    endpoint: String,
    token: Option<String>,
    /// Follows no redirect: a file's metadata is read from the Hub's own answer.
    head: ureq::Agent,
    /// Follows redirects (without the token) to the storage host.
    get: ureq::Agent,
    progress: bool,
    limits: Limits,
}

/// What one file's download may take, so that a broken or hostile Hub (`HF_ENDPOINT`) cannot
/// fill the disk or hold the process: the body stops at the size announced for it, a size
/// above `max_file` is refused before anything is written, a file whose size is not announced
/// stops at `unannounced`, and the bytes still to come must arrive within `grace` plus their
/// count at `min_rate` bytes a second (the partial file is kept: the next run continues it).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub min_rate: u64,
    pub grace: Duration,
    pub unannounced: u64,
    pub max_file: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            min_rate: 128 << 10,
            grace: Duration::from_secs(120),
            unannounced: 1 << 30,
            max_file: 512 << 30,
        }
    }
}

impl Limits {
    /// The time `bytes` more may take.
    fn deadline(&self, bytes: u64) -> Duration {
        self.grace + Duration::from_secs(bytes / self.min_rate.max(1))
    }
}

/// A file's blob as the Hub announces it.
struct Blob {
    etag: String,
    size: Option<u64>,
}

impl Hub {
    /// The Hub of the environment (`HF_ENDPOINT`, `HF_TOKEN`, the token file); `var` reads it.
    pub fn from_env(var: &dyn Fn(&str) -> Option<String>) -> Self {
        let set = |k: &str| var(k).filter(|v| !v.trim().is_empty());
        let endpoint = set("HF_ENDPOINT").unwrap_or_else(|| "https://huggingface.co".into());
        let token = set("HF_TOKEN").or_else(|| {
            let file = set("HF_TOKEN_PATH").map(PathBuf::from).or_else(|| {
                let home = set("HF_HOME").map(PathBuf::from).or_else(|| {
                    set("HOME").map(|h| PathBuf::from(h).join(".cache").join("huggingface"))
                });
                home.map(|h| h.join("token"))
            });
            file.and_then(|f| std::fs::read_to_string(f).ok())
                .map(|t| t.trim().to_string())
                .filter(|t| !t.is_empty())
        });
        let agent = |redirects: u32| -> ureq::Agent {
            ureq::Agent::config_builder()
                .max_redirects(redirects)
                .timeout_connect(Some(Duration::from_secs(20)))
                .timeout_recv_response(Some(Duration::from_secs(60)))
                .timeout_per_read(Some(Duration::from_secs(60)))
                .accept_encoding("identity")
                .http_status_as_error(false)
                .build()
                .into()
        };
        Self {
            endpoint: endpoint.trim_end_matches('/').to_string(),
            token,
            head: agent(0),
            get: agent(10),
            progress: std::io::IsTerminal::is_terminal(&std::io::stderr()),
            limits: Limits::default(),
        }
    }

    /// The same Hub with other download limits.
    #[cfg(test)]
    pub(crate) fn with_limits(self, limits: Limits) -> Self {
        Self { limits, ..self }
    }

    /// Downloads `id` into the cache folder `cache` (its one file, or the files Ember reads from
    /// a model folder: the JSON, Jinja and safetensors files at its top).
    ///
    /// # Errors
    /// The Hub's refusal (no such model or revision, a gated model without a token), a file the
    /// revision does not have, a network failure, bytes that do not match the announced size or
    /// checksum; the message names the model and the file.
    pub fn fetch(&self, id: &HubId, cache: &Path) -> Result<()> {
        let repo = format!("{}/{}", id.org, id.name);
        let url = format!(
            "{}/api/models/{repo}/revision/{}",
            self.endpoint, id.revision
        );
        let info = self.json(&url, &repo)?;
        let commit = info["sha"]
            .as_str()
            .filter(|s| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric()))
            .ok_or_else(|| fail(&repo, &format!("{url} answered without a commit")))?
            .to_string();
        let listed: Vec<&str> = info["siblings"]
            .as_array()
            .map(|s| s.iter().filter_map(|f| f["rfilename"].as_str()).collect())
            .unwrap_or_default();
        let mut files = wanted(id, &listed).map_err(|why| fail(&repo, &why))?;
        let dir = cache.join(format!("models--{}--{}", id.org, id.name));
        let index = "model.safetensors.index.json";
        if id.file.is_none() && files.iter().any(|f| f == index) {
            // Sharded weights: only the shards the index names (a repository may also hold a
            // consolidated copy of the same weights).
            self.file(&dir, &repo, &commit, index)?;
            let shards = shards(&dir.join("snapshots").join(&commit).join(index));
            files.retain(|f| !f.ends_with(".safetensors") || shards.contains(f));
        }
        for file in &files {
            self.file(&dir, &repo, &commit, file)?;
        }
        if id.revision != commit {
            let refs = dir.join("refs");
            std::fs::create_dir_all(&refs).map_err(|e| HubError::io(&refs, e))?;
            write_atomic(&refs.join(&id.revision), commit.as_bytes())
                .map_err(|e| HubError::io(refs.join(&id.revision), e))?;
        }
        Ok(())
    }

    /// A GET of the Hub's API with the token; the answer's JSON.
    fn json(&self, url: &str, repo: &str) -> Result<Value> {
        let mut req = self.head.get(url);
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let mut resp = req
            .call()
            .map_err(|e| fail(repo, &format!("{url}: no answer ({e})")))?;
        let status = resp.status().as_u16();
        // ureq stops a body read to a string at 10 MiB: a listing may announce no more.
        let text = match (status, resp.body_mut().read_to_string()) {
            (200, Err(e)) => {
                return Err(fail(
                    repo,
                    &format!("{url}: an answer over 10 MiB or cut ({e})"),
                ));
            }
            (_, read) => read.unwrap_or_default(),
        };
        match status {
            200 => serde_json::from_str(&text)
                .map_err(|e| fail(repo, &format!("{url} answered malformed JSON ({e})"))),
            401 | 403 => Err(fail(
                repo,
                &format!(
                    "{url}: HTTP {status}: a gated or private model; accept its terms on the Hub \
                     and set HF_TOKEN (or run `huggingface-cli login`)"
                ),
            )),
            404 => Err(fail(
                repo,
                &format!(
                    "{url}: HTTP 404: no such model or revision on {}",
                    self.endpoint
                ),
            )),
            _ => Err(fail(repo, &format!("{url}: HTTP {status}"))),
        }
    }

    /// One file: its blob downloaded (or found), its snapshot link made.
    fn file(&self, dir: &Path, repo: &str, commit: &str, file: &str) -> Result<()> {
        let link = dir.join("snapshots").join(commit).join(file);
        if link.exists() {
            return Ok(());
        }
        let url = format!(
            "{}/{repo}/resolve/{commit}/{}",
            self.endpoint,
            url_path(file)
        );
        let blob = self.metadata(&url, repo, file)?;
        let blobs = dir.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(|e| HubError::io(&blobs, e))?;
        let path = blobs.join(&blob.etag);
        if !path.exists() {
            // One process downloads a blob at a time: the lock huggingface_hub takes,
            // `<cache>/.locks/models--ORG--NAME/<etag>.lock`.
            let locks = dir
                .parent()
                .unwrap_or(dir)
                .join(".locks")
                .join(dir.file_name().unwrap_or_default());
            std::fs::create_dir_all(&locks).map_err(|e| HubError::io(&locks, e))?;
            let lock_path = locks.join(format!("{}.lock", blob.etag));
            let lock =
                std::fs::File::create(&lock_path).map_err(|e| HubError::io(&lock_path, e))?;
            lock.lock().map_err(|e| HubError::io(&lock_path, e))?;
            if !path.exists() {
                self.blob(&url, &blob, &path, &format!("{repo}/{file}"))?;
            }
        }
        link_blob(&link, &path, file)
    }

    /// The blob's ETag and size from the Hub's answer to a HEAD of the file (a redirect to
    /// another host answers with them too; a relative one is followed).
    fn metadata(&self, url: &str, repo: &str, file: &str) -> Result<Blob> {
        let mut url = url.to_string();
        for _ in 0..5 {
            let mut req = self.head.head(&url);
            if let Some(t) = &self.token {
                req = req.header("authorization", format!("Bearer {t}"));
            }
            let resp = req
                .call()
                .map_err(|e| fail(repo, &format!("{url}: no answer ({e})")))?;
            let status = resp.status().as_u16();
            let header = |k: &str| {
                resp.headers()
                    .get(k)
                    .and_then(|v| v.to_str().ok())
                    .map(|v| {
                        v.trim()
                            .trim_start_matches("W/")
                            .trim_matches('"')
                            .to_string()
                    })
            };
            let location = header("location").filter(|l| l.starts_with('/'));
            if let (300..=399, Some(loc), None) = (status, &location, header("x-linked-etag")) {
                url = format!("{}{loc}", self.endpoint);
                continue;
            }
            if !(200..400).contains(&status) {
                let why = match status {
                    404 => format!("{file} is not in the revision ({url}: HTTP 404)"),
                    401 | 403 => format!("{url}: HTTP {status}: set HF_TOKEN for a gated model"),
                    s => format!("{url}: HTTP {s}"),
                };
                return Err(fail(repo, &why));
            }
            let etag = header("x-linked-etag")
                .or_else(|| header("etag"))
                .filter(|e| {
                    !e.is_empty() && e.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                })
                .ok_or_else(|| fail(repo, &format!("{url}: no ETag to name the file's blob")))?;
            let size: Option<u64> = header("x-linked-size")
                .or_else(|| header("content-length").filter(|_| status < 300))
                .and_then(|s| s.parse().ok());
            if let Some(s) = size.filter(|s| *s > self.limits.max_file) {
                let why = format!(
                    "{url} announces {} for {file}, above the {} a file may have",
                    mib(s),
                    mib(self.limits.max_file)
                );
                return Err(fail(repo, &why));
            }
            return Ok(Blob { etag, size });
        }
        Err(fail(repo, &format!("{url}: too many redirects")))
    }

    /// Downloads the blob to `path` through `<path>.incomplete` (continued where an earlier
    /// download stopped), checking the size and, for an LFS file, the SHA-256.
    fn blob(&self, url: &str, blob: &Blob, path: &Path, name: &str) -> Result<()> {
        let part = path.with_extension("incomplete");
        let mut have = std::fs::metadata(&part).map_or(0, |m| m.len());
        if blob.size.is_some_and(|s| have > s) {
            have = 0;
        }
        let mut req = self.get.get(url);
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if have > 0 {
            req = req.header("range", format!("bytes={have}-"));
        }
        let resp = req
            .call()
            .map_err(|e| fail(name, &format!("{url}: no answer ({e})")))?;
        let status = resp.status().as_u16();
        // 206: the rest (from where the partial file ends); 200: the whole file (a server that
        // ignores ranges); 416: nothing left, when the partial file is whole.
        let from = resp
            .headers()
            .get("content-range")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("bytes "))
            .and_then(|v| v.split('-').next())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let append = match status {
            206 if from.is_none_or(|f| f == have) => true,
            200 => false,
            416 if blob.size == Some(have) => true,
            s => {
                // A partial file the server cannot continue: start afresh next time.
                let _ = std::fs::remove_file(&part);
                let why = format!("{url}: HTTP {s} to a resumed download; run again");
                return Err(fail(name, &why));
            }
        };
        let mut out = std::fs::OpenOptions::new()
            .create(true)
            .append(append)
            .write(true)
            .truncate(!append)
            .open(&part)
            .map_err(|e| HubError::io(&part, e))?;
        let done = if append { have } else { 0 };
        if status != 416 {
            let body = resp.into_body().into_reader();
            let to = Span {
                done,
                size: blob.size,
                name,
            };
            self.copy(body, &mut out, &part, to)?;
        }
        drop(out);
        check(&part, blob, name)?;
        std::fs::rename(&part, path).map_err(|e| HubError::io(path, e))
    }

    /// Copies the body into the file, with a progress line on a terminal, within the limits:
    /// a body longer than the announced size (or the cap for an unannounced one) is an error
    /// that removes the partial file; one slower than the deadline an error that keeps it.
    fn copy(
        &self,
        mut body: impl Read,
        out: &mut std::fs::File,
        part: &Path,
        to: Span,
    ) -> Result<()> {
        let (mut done, size, name) = (to.done, to.size, to.name);
        let limit = size.unwrap_or(self.limits.unannounced);
        let allowed = self.limits.deadline(limit.saturating_sub(done));
        let start = Instant::now();
        let mut buf = vec![0u8; 1 << 20];
        let mut shown = Instant::now();
        eprintln!(
            "downloading {name} ({})",
            size.map_or("size unknown".into(), mib)
        );
        loop {
            let n = body.read(&mut buf).map_err(|e| {
                fail(
                    name,
                    &format!("the download broke off ({e}); run again to continue it"),
                )
            })?;
            if n == 0 {
                break;
            }
            if done.saturating_add(n as u64) > limit {
                let _ = std::fs::remove_file(part);
                let what = match size {
                    Some(s) => format!("the {s} bytes the Hub announced"),
                    None => format!("{limit} bytes, the most a file of unannounced size may have"),
                };
                return Err(fail(
                    name,
                    &format!("the body runs past {what}; the partial file is removed"),
                ));
            }
            out.write_all(&buf[..n])
                .map_err(|e| HubError::io(part, e))?;
            done += n as u64;
            if start.elapsed() > allowed {
                let why = format!(
                    "{} of {} in {} s, past the deadline for its size (at least {} KiB/s after \
                     {} s); run again to continue it",
                    mib(done),
                    mib(limit),
                    allowed.as_secs(),
                    self.limits.min_rate >> 10,
                    self.limits.grace.as_secs()
                );
                return Err(fail(name, &why));
            }
            if self.progress && shown.elapsed() > Duration::from_millis(500) {
                shown = Instant::now();
                eprint!(
                    "\r  {} of {}\x1b[K",
                    mib(done),
                    size.map_or("?".into(), mib)
                );
            }
        }
        if self.progress {
            eprintln!("\r  {}\x1b[K", mib(done));
        }
        out.flush().map_err(|e| HubError::io(part, e))
    }
}

/// Where a download stands: the bytes already in the partial file, the announced size, the
/// name errors give.
struct Span<'a> {
    done: u64,
    size: Option<u64>,
    name: &'a str,
}

/// A file name of the Hub's listing that is safe as a path under the snapshot: parts that are
/// not empty, `.` or `..`, without backslashes, colons or control characters.
fn safe_name(f: &str) -> bool {
    f.split('/').all(|p| !p.is_empty() && p != "." && p != "..")
        && !f.chars().any(|c| c == '\\' || c == ':' || c.is_control())
}

/// A file's path in a URL: each part percent-encoded (RFC 3986's unreserved characters kept).
fn url_path(f: &str) -> String {
    f.split('/')
        .map(|p| {
            p.bytes()
                .map(
                    |b| match b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                        true => (b as char).to_string(),
                        false => format!("%{b:02X}"),
                    },
                )
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("/")
}

/// The files to fetch: the one asked for, or the JSON, Jinja and safetensors files at the top
/// of a model folder (what `huggingface-cli download --include` would be told for Ember).
fn wanted(id: &HubId, listed: &[&str]) -> std::result::Result<Vec<String>, String> {
    let listed: Vec<&str> = listed.iter().copied().filter(|f| safe_name(f)).collect();
    if let Some(f) = &id.file {
        if !listed.is_empty() && !listed.contains(&f.as_str()) {
            return Err(format!("revision {} has no file {f}", id.revision));
        }
        return Ok(vec![f.clone()]);
    }
    let files: Vec<String> = listed
        .iter()
        .filter(|f| !f.contains('/'))
        .filter(|f| {
            [".json", ".jinja", ".safetensors"]
                .iter()
                .any(|e| f.ends_with(e))
        })
        .map(|f| f.to_string())
        .collect();
    if !files.iter().any(|f| f.ends_with(".safetensors")) {
        let ggufs: Vec<&&str> = listed
            .iter()
            .filter(|f| f.ends_with(".gguf"))
            .take(4)
            .collect();
        return Err(match ggufs.is_empty() {
            true => "no safetensors weights at the top of the repository".into(),
            false => format!(
                "no safetensors weights; name one of its GGUF files: {}",
                ggufs
                    .iter()
                    .map(|g| format!("{}/{}/{g}", id.org, id.name))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        });
    }
    Ok(files)
}

/// The downloaded bytes match the announced size and, for an LFS file (a 64-hex ETag), its
/// SHA-256; a mismatch removes them.
fn check(part: &Path, blob: &Blob, name: &str) -> Result<()> {
    let len = std::fs::metadata(part)
        .map_err(|e| HubError::io(part, e))?
        .len();
    let bad = |why: String| {
        let _ = std::fs::remove_file(part);
        Err(fail(
            name,
            &format!("{why}; the partial file is removed: run again"),
        ))
    };
    if let Some(size) = blob.size.filter(|s| *s != len) {
        return bad(format!("{len} bytes downloaded, the Hub announced {size}"));
    }
    let lfs = blob.etag.len() == 64 && blob.etag.chars().all(|c| c.is_ascii_hexdigit());
    if lfs {
        let mut f = std::fs::File::open(part).map_err(|e| HubError::io(part, e))?;
        let mut hash = Sha256::new();
        std::io::copy(&mut f, &mut hash).map_err(|e| HubError::io(part, e))?;
        let got: String = hash.finalize().iter().map(|b| format!("{b:02x}")).collect();
        if !got.eq_ignore_ascii_case(&blob.etag) {
            return bad(format!(
                "SHA-256 {got} does not match the Hub's {}",
                blob.etag
            ));
        }
    }
    Ok(())
}

/// `snapshots/<commit>/<file>` → `../../blobs/<etag>` (one more `..` for each folder in
/// `file`); a copy where links cannot be made.
fn link_blob(link: &Path, blob: &Path, file: &str) -> Result<()> {
    let parent = link.parent().unwrap_or(link);
    std::fs::create_dir_all(parent).map_err(|e| HubError::io(parent, e))?;
    let up = "../".repeat(2 + file.matches('/').count());
    let etag = blob
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let target = PathBuf::from(format!("{up}blobs/{etag}"));
    // A link left by an earlier download whose blob is gone is replaced.
    if link.symlink_metadata().is_ok() {
        std::fs::remove_file(link).map_err(|e| HubError::io(link, e))?;
    }
    #[cfg(unix)]
    let made = match std::os::unix::fs::symlink(&target, link) {
        // Made meanwhile by another process fetching the same model.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && link.exists() => Ok(()),
        other => other,
    };
    #[cfg(not(unix))]
    let made = std::fs::copy(blob, link).map(|_| ());
    made.map_err(|e| HubError::io(link, e))
}

/// Writes `bytes` to `path` through a temporary file in the same folder, synced and renamed
/// over it: a reader sees the old ref or the new, never a part.
fn write_atomic(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".tmp{}", std::process::id()));
    let tmp = path.with_file_name(name);
    let res = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if res.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    res
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn fail(what: &str, why: &str) -> HubError {
    HubError::Missing(format!(
        "downloading {what} from the Hugging Face Hub: {why}"
    ))
}

#[cfg(test)]
mod tests {
    use crate::resolve_with;
    use std::io::{BufRead, BufReader, Write};
    use std::net::TcpListener;
    use std::path::{Path, PathBuf};
    use std::sync::{Arc, Mutex};

    const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
    /// A git blob id, as the Hub gives small files for their ETag.
    const CONFIG_ETAG: &str = "d1b2a59fbea7e20077af9f91b27e95e865061b27";

    /// A request the mock saw: method, path, whether it carried the token, its Range.
    type Seen = Arc<Mutex<Vec<(String, String, bool, Option<String>)>>>;

    fn weights() -> Vec<u8> {
        (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect()
    }

    fn sha256_hex(b: &[u8]) -> String {
        use sha2::Digest;
        sha2::Sha256::digest(b)
            .iter()
            .map(|x| format!("{x:02x}"))
            .collect()
    }

    /// A Hub on loopback serving `org/tiny` at `main`: config.json (small, its own ETag) and
    /// model.safetensors (LFS: a redirect to a storage path, like the Hub's CDN). `corrupt`
    /// serves other bytes than the checksum says.
    fn mock_hub(corrupt: bool) -> (String, Seen) {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let seen: Seen = Arc::default();
        let (b, s) = (base.clone(), seen.clone());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                if reader.read_line(&mut line).is_err() {
                    continue;
                }
                let (mut auth, mut range) = (false, None);
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                        break;
                    }
                    let lower = h.to_ascii_lowercase();
                    auth |= lower.starts_with("authorization: bearer hf_test");
                    if let Some(r) = lower.strip_prefix("range: bytes=") {
                        range = Some(r.trim().to_string());
                    }
                }
                let mut parts = line.split_whitespace();
                let (method, path) = (
                    parts.next().unwrap_or("").to_string(),
                    parts.next().unwrap_or("").to_string(),
                );
                s.lock()
                    .unwrap()
                    .push((method.clone(), path.clone(), auth, range.clone()));
                let reply = answer(&method, &path, range.as_deref(), &b, corrupt);
                let mut stream = stream;
                let _ = stream.write_all(&reply);
            }
        });
        (base, seen)
    }

    /// The mock's answer (headers and body) to one request.
    fn answer(method: &str, path: &str, range: Option<&str>, base: &str, corrupt: bool) -> Vec<u8> {
        let config = b"{\"model_type\":\"llama\"}".to_vec();
        let w = weights();
        let sha = sha256_hex(&w);
        let (status, headers, body): (&str, Vec<String>, Vec<u8>) = match path {
            "/api/models/org/tiny/revision/main" => {
                let files = [
                    "config.json",
                    "model.safetensors",
                    "README.md",
                    "onnx/model.onnx",
                ];
                let siblings: Vec<String> = files
                    .iter()
                    .map(|f| format!("{{\"rfilename\":\"{f}\"}}"))
                    .collect();
                let body = format!(
                    "{{\"sha\":\"{COMMIT}\",\"siblings\":[{}]}}",
                    siblings.join(",")
                );
                ("200 OK", vec![], body.into_bytes())
            }
            p if p == format!("/org/tiny/resolve/{COMMIT}/config.json") => (
                "200 OK",
                vec![
                    format!("ETag: \"{CONFIG_ETAG}\""),
                    format!("X-Repo-Commit: {COMMIT}"),
                ],
                config,
            ),
            p if p == format!("/org/tiny/resolve/{COMMIT}/model.safetensors") => (
                "302 Found",
                vec![
                    format!("Location: {base}/cdn/model"),
                    format!("X-Linked-Etag: \"{sha}\""),
                    format!("X-Linked-Size: {}", w.len()),
                ],
                vec![],
            ),
            "/cdn/model" => {
                let mut data = w.clone();
                if corrupt {
                    data[5] ^= 1;
                }
                let start: usize = range
                    .and_then(|r| r.trim_end_matches('-').parse().ok())
                    .unwrap_or(0);
                match range {
                    Some(_) => (
                        "206 Partial Content",
                        vec![format!(
                            "Content-Range: bytes {start}-{}/{}",
                            data.len() - 1,
                            data.len()
                        )],
                        data[start..].to_vec(),
                    ),
                    None => ("200 OK", vec![], data),
                }
            }
            _ => (
                "404 Not Found",
                vec![],
                b"{\"error\":\"Repository not found\"}".to_vec(),
            ),
        };
        let mut head = format!(
            "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n",
            body.len()
        );
        for h in headers {
            head += &h;
            head += "\r\n";
        }
        head += "\r\n";
        let mut out = head.into_bytes();
        if method != "HEAD" {
            out.extend(body);
        }
        out
    }

    fn tmp(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("ember-hubdl-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn env(base: &str, offline: bool) -> impl Fn(&str) -> Option<String> + '_ {
        move |k: &str| match k {
            "HF_ENDPOINT" => Some(base.to_string()),
            "HF_TOKEN" => Some("hf_test".into()),
            "HF_HUB_OFFLINE" if offline => Some("1".into()),
            "NO_PROXY" | "no_proxy" => Some("127.0.0.1".into()),
            _ => None,
        }
    }

    #[test]
    fn a_model_is_downloaded_into_the_huggingface_cache_layout() {
        let (base, seen) = mock_hub(false);
        let cache = tmp("layout");
        let dirs = [cache.clone()];
        let got = resolve_with(Path::new("org/tiny"), &dirs, &env(&base, false)).unwrap();
        let repo = cache.join("models--org--tiny");
        assert_eq!(got, repo.join("snapshots").join(COMMIT));
        assert_eq!(
            std::fs::read_to_string(repo.join("refs/main")).unwrap(),
            COMMIT
        );
        let link = std::fs::read_link(got.join("config.json")).unwrap();
        assert_eq!(link, PathBuf::from(format!("../../blobs/{CONFIG_ETAG}")));
        assert_eq!(
            std::fs::read(got.join("model.safetensors")).unwrap(),
            weights()
        );
        assert!(!got.join("README.md").exists() && !got.join("onnx").exists());
        {
            let seen = seen.lock().unwrap();
            // The token goes to the Hub, never to the storage host a large file redirects to.
            for (_, path, auth, _) in seen.iter() {
                assert_eq!(*auth, !path.starts_with("/cdn/"), "{path}");
            }
        }
        // Found in the cache the second time: no request.
        let before = seen.lock().unwrap().len();
        resolve_with(Path::new("org/tiny"), &dirs, &env(&base, false)).unwrap();
        assert_eq!(seen.lock().unwrap().len(), before);
        std::fs::remove_dir_all(&cache).ok();
    }

    #[test]
    fn a_broken_off_download_continues_and_bad_bytes_are_refused() {
        let (base, seen) = mock_hub(false);
        let cache = tmp("resume");
        let blobs = cache.join("models--org--tiny/blobs");
        std::fs::create_dir_all(&blobs).unwrap();
        let sha = sha256_hex(&weights());
        std::fs::write(
            blobs.join(format!("{sha}.incomplete")),
            &weights()[..40_000],
        )
        .unwrap();
        let spec = Path::new("org/tiny/model.safetensors");
        let got = resolve_with(spec, std::slice::from_ref(&cache), &env(&base, false)).unwrap();
        assert_eq!(std::fs::read(&got).unwrap(), weights());
        let ranges: Vec<Option<String>> = seen
            .lock()
            .unwrap()
            .iter()
            .filter(|r| r.1 == "/cdn/model")
            .map(|r| r.3.clone())
            .collect();
        assert_eq!(ranges, vec![Some("40000-".to_string())]);

        let (bad, _) = mock_hub(true);
        let cache2 = tmp("corrupt");
        let e = resolve_with(spec, std::slice::from_ref(&cache2), &env(&bad, false))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("SHA-256") && e.contains("org/tiny/model.safetensors"),
            "{e}"
        );
        let left: Vec<_> = std::fs::read_dir(cache2.join("models--org--tiny/blobs"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert!(
            left.iter().all(|n| n.to_string_lossy().ends_with(".lock")),
            "{left:?}"
        );
        for d in [cache, cache2] {
            std::fs::remove_dir_all(d).ok();
        }
    }

    /// A folder another tool left with its config only is completed, not loaded without its
    /// weights; a link whose blob is gone is made again.
    #[test]
    fn a_partial_cache_folder_is_completed() {
        let (base, _) = mock_hub(false);
        let cache = tmp("partial");
        let dirs = [cache.clone()];
        let only = Path::new("org/tiny/config.json");
        let got = resolve_with(only, &dirs, &env(&base, false)).unwrap();
        assert!(got.ends_with("config.json"));
        let snap = cache.join("models--org--tiny/snapshots").join(COMMIT);
        assert!(!snap.join("model.safetensors").exists());
        let got = resolve_with(Path::new("org/tiny"), &dirs, &env(&base, false)).unwrap();
        assert_eq!(
            std::fs::read(got.join("model.safetensors")).unwrap(),
            weights()
        );
        let blob = std::fs::read_link(got.join("model.safetensors")).unwrap();
        std::fs::remove_file(snap.join(&blob)).unwrap();
        let got = resolve_with(Path::new("org/tiny"), &dirs, &env(&base, false)).unwrap();
        assert_eq!(
            std::fs::read(got.join("model.safetensors")).unwrap(),
            weights()
        );
        // The lock is where huggingface_hub takes it.
        assert!(cache.join(".locks/models--org--tiny").is_dir());
        std::fs::remove_dir_all(&cache).ok();
    }

    #[test]
    fn listed_names_are_kept_inside_the_snapshot() {
        assert!(super::safe_name("config.json") && super::safe_name("sub/x.json"));
        for bad in [
            "../x.json",
            "a//b.json",
            "/abs.json",
            "a\\..\\b.json",
            "c:x.json",
            "./x",
        ] {
            assert!(!super::safe_name(bad), "{bad}");
        }
        assert_eq!(super::url_path("sub dir/a#b.json"), "sub%20dir/a%23b.json");
    }

    #[test]
    fn offline_and_unknown_models_say_why() {
        let (base, seen) = mock_hub(false);
        let cache = tmp("offline");
        let dirs = [cache.clone()];
        let e = resolve_with(Path::new("org/tiny"), &dirs, &env(&base, true))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("HF_HUB_OFFLINE is set") && e.contains("huggingface-cli download org/tiny"),
            "{e}"
        );
        assert!(seen.lock().unwrap().is_empty(), "offline asked the Hub");
        let e = resolve_with(Path::new("org/nothing"), &dirs, &env(&base, false))
            .unwrap_err()
            .to_string();
        assert!(e.contains("no such model or revision"), "{e}");
        let e = resolve_with(Path::new("org/tiny/absent.gguf"), &dirs, &env(&base, false))
            .unwrap_err()
            .to_string();
        assert!(e.contains("has no file absent.gguf"), "{e}");
        std::fs::remove_dir_all(&cache).ok();
    }

    /// How a hostile Hub sends a file's body.
    #[derive(Clone, Copy)]
    enum Body {
        /// Without a length, until the client hangs up (at most 256 MiB).
        Endless,
        /// Its announced length, one byte every 20 ms.
        Trickle,
    }

    /// A Hub on loopback whose `org/evil` holds one LFS file announced (or not) at `announce`
    /// bytes, sent as `body` says.
    fn hostile_hub(announce: Option<u64>, body: Body) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let mut reader = BufReader::new(stream.try_clone().unwrap());
                let mut line = String::new();
                let _ = reader.read_line(&mut line);
                loop {
                    let mut h = String::new();
                    if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                        break;
                    }
                }
                let mut stream = stream;
                let sized = |n: usize| format!("Content-Length: {n}\r\n");
                if line.contains("/api/models/") {
                    let listing = format!(
                        "{{\"sha\":\"{COMMIT}\",\"siblings\":[{{\"rfilename\":\"w.gguf\"}}]}}"
                    );
                    let head = format!(
                        "HTTP/1.1 200 OK\r\n{}Connection: close\r\n\r\n",
                        sized(listing.len())
                    );
                    let _ = stream.write_all(format!("{head}{listing}").as_bytes());
                } else if line.starts_with("HEAD") {
                    let size =
                        announce.map_or(String::new(), |n| format!("X-Linked-Size: {n}\r\n"));
                    let etag = "e".repeat(64);
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nX-Linked-Etag: \"{etag}\"\r\n{size}Connection: close\r\n\r\n"
                    );
                    let _ = stream.write_all(head.as_bytes());
                } else {
                    serve_body(&mut stream, announce, body);
                }
            }
        });
        base
    }

    fn serve_body(stream: &mut std::net::TcpStream, announce: Option<u64>, body: Body) {
        match body {
            Body::Endless => {
                let _ = stream.write_all(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
                let chunk = vec![7u8; 1 << 16];
                for _ in 0..4096 {
                    if stream.write_all(&chunk).is_err() {
                        break;
                    }
                }
            }
            Body::Trickle => {
                let n = announce.unwrap_or(0);
                let head =
                    format!("HTTP/1.1 200 OK\r\nContent-Length: {n}\r\nConnection: close\r\n\r\n");
                let _ = stream.write_all(head.as_bytes());
                for _ in 0..n {
                    std::thread::sleep(std::time::Duration::from_millis(20));
                    if stream.write_all(b"x").is_err() {
                        break;
                    }
                }
            }
        }
    }

    /// Downloads `org/evil/w.gguf` from `base` within `limits`; the error and the names left
    /// in the blobs folder.
    fn fetch_evil(base: &str, limits: super::Limits, tag: &str) -> (String, Vec<String>) {
        let cache = tmp(tag);
        let hub = super::Hub::from_env(&env(base, false)).with_limits(limits);
        let id = crate::id::hub_id("org/evil/w.gguf").unwrap();
        let e = hub.fetch(&id, &cache).unwrap_err().to_string();
        let left = std::fs::read_dir(cache.join("models--org--evil/blobs"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default();
        std::fs::remove_dir_all(&cache).ok();
        (e, left)
    }

    /// A Hub that announces 100 bytes and then sends an endless body: the download stops at
    /// the announced size and removes what it wrote; an unannounced size stops at the cap.
    #[test]
    fn a_body_longer_than_announced_stops_and_is_removed() {
        let limits = super::Limits::default();
        let (e, left) = fetch_evil(&hostile_hub(Some(100), Body::Endless), limits, "endless");
        assert!(
            e.contains("runs past the 100 bytes the Hub announced"),
            "{e}"
        );
        assert!(left.iter().all(|n| !n.contains("incomplete")), "{left:?}");
        let capped = super::Limits {
            unannounced: 1 << 20,
            ..limits
        };
        let (e, left) = fetch_evil(&hostile_hub(None, Body::Endless), capped, "unannounced");
        assert!(
            e.contains("1048576 bytes, the most a file of unannounced size"),
            "{e}"
        );
        assert!(left.iter().all(|n| !n.contains("incomplete")), "{left:?}");
        let small = super::Limits {
            max_file: 50,
            ..limits
        };
        let (e, left) = fetch_evil(&hostile_hub(Some(100), Body::Endless), small, "huge");
        assert!(e.contains("above the"), "{e}");
        assert!(left.is_empty(), "{left:?}");
    }

    /// A body that trickles stops at the deadline for its size, and the partial file stays for
    /// the next run to continue.
    #[test]
    fn a_trickling_body_stops_at_its_deadline_and_keeps_what_came() {
        let limits = super::Limits {
            min_rate: u64::MAX,
            grace: std::time::Duration::from_millis(200),
            ..super::Limits::default()
        };
        let (e, left) = fetch_evil(&hostile_hub(Some(5_000), Body::Trickle), limits, "trickle");
        assert!(
            e.contains("past the deadline") && e.contains("run again"),
            "{e}"
        );
        assert!(left.iter().any(|n| n.ends_with(".incomplete")), "{left:?}");
    }
}
