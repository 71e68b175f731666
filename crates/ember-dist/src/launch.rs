//! Rank, world size and local rank from the launcher's environment.
//!
//! | launcher | rank | size | local rank | local size | master |
//! |---|---|---|---|---|---|
//! | Open MPI `mpirun` | `OMPI_COMM_WORLD_RANK` | `OMPI_COMM_WORLD_SIZE` | `OMPI_COMM_WORLD_LOCAL_RANK` | `OMPI_COMM_WORLD_LOCAL_SIZE` | — |
//! | MPICH (Hydra) `mpiexec` | `PMI_RANK` | `PMI_SIZE` | `MPI_LOCALRANKID` | `MPI_LOCALNRANKS` | — |
//! | `torchrun` | `RANK` | `WORLD_SIZE` | `LOCAL_RANK` | `LOCAL_WORLD_SIZE` | `MASTER_ADDR` |
//! | Slurm `srun` | `SLURM_PROCID` | `SLURM_STEP_NUM_TASKS` (`SLURM_NTASKS`) | `SLURM_LOCALID` | `SLURM_STEP_TASKS_PER_NODE` | first host of `SLURM_STEP_NODELIST` (`SLURM_JOB_NODELIST`) |
//!
//! Slurm's variables count only inside a job step (`SLURM_STEP_ID` set, as `srun` sets it): a
//! batch script has `SLURM_PROCID=0` and `SLURM_NTASKS=N` too, and every process `mpirun`
//! starts from it inherits them. They also count only alone: under `srun torchrun …` or an
//! `mpirun` whose daemons `srun` started, the inner launcher's ranks are the processes', and
//! Slurm gives rank 0's host (`MASTER_ADDR` first, where set).

use crate::error::DistError;
use std::collections::BTreeMap;

/// The launcher that started the process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// None: a world of one.
    Single,
    /// Open MPI's `mpirun`.
    OpenMpi,
    /// MPICH's (Hydra's) `mpiexec`/`mpirun`, or any PMI launcher.
    Mpich,
    /// PyTorch's `torchrun` (`--no-python ember train …`).
    Torchrun,
    /// Slurm's `srun`.
    Slurm,
}

impl Launcher {
    /// The name users know.
    pub fn name(self) -> &'static str {
        match self {
            Self::Single => "no launcher",
            Self::OpenMpi => "Open MPI (mpirun)",
            Self::Mpich => "MPICH (PMI)",
            Self::Torchrun => "torchrun",
            Self::Slurm => "Slurm (srun)",
        }
    }

    /// Whether its processes can form an MPI world (`MPI_Init` finds its peers).
    pub fn has_mpi(self) -> bool {
        matches!(self, Self::OpenMpi | Self::Mpich | Self::Slurm)
    }
}

/// This process's place in the world, as its launcher set it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The launcher.
    pub launcher: Launcher,
    /// This process's rank, `0..size`.
    pub rank: usize,
    /// Processes in the world.
    pub size: usize,
    /// Rank among the processes of this node.
    pub local_rank: usize,
    /// Processes on this node.
    pub local_size: usize,
    /// The host of rank 0, where a launcher names it (`MASTER_ADDR`, Slurm's first node).
    pub master: Option<String>,
    /// `MASTER_PORT`, where set (torchrun's own store listens there).
    pub master_port: Option<u16>,
}

impl Launch {
    /// A world of one.
    pub fn single() -> Self {
        Self {
            launcher: Launcher::Single,
            rank: 0,
            size: 1,
            local_rank: 0,
            local_size: 1,
            master: None,
            master_port: None,
        }
    }

    /// The world this process's environment describes.
    ///
    /// # Errors
    /// A variable that is not a number, one missing beside another that needs it, numbers that
    /// describe no world, or two launchers that disagree.
    pub fn from_env() -> Result<Self, DistError> {
        Self::from_vars(&std::env::vars().collect())
    }

    /// The world `vars` describe (see the module's table).
    ///
    /// # Errors
    /// As [`from_env`](Self::from_env).
    pub fn from_vars(vars: &BTreeMap<String, String>) -> Result<Self, DistError> {
        let v = Vars(vars);
        let found: Vec<Self> = [v.open_mpi()?, v.mpich()?, v.torchrun()?]
            .into_iter()
            .flatten()
            .collect();
        // Slurm's variables describe the step that started the launcher when another launcher
        // runs inside it (`srun torchrun …`, `mpirun` on nodes whose daemons srun started):
        // they count only alone, and give rank 0's host otherwise.
        let slurm = v.slurm()?;
        let Some(first) = found.first().or(slurm.as_ref()) else {
            return Ok(Self::single());
        };
        for other in found.iter().skip(1) {
            if (other.rank, other.size) != (first.rank, first.size) {
                return Err(DistError::Disagree {
                    a: first.launcher.name(),
                    ra: first.rank,
                    sa: first.size,
                    b: other.launcher.name(),
                    rb: other.rank,
                    sb: other.size,
                });
            }
        }
        // The MPI launchers name no master; torchrun or Slurm beside them may.
        let mut launch = first.clone();
        if launch.master.is_none() {
            launch.master = found.iter().chain(&slurm).find_map(|l| l.master.clone());
            launch.master_port = found.iter().chain(&slurm).find_map(|l| l.master_port);
        }
        launch.check()?;
        Ok(launch)
    }

    /// The GPU this rank uses: 0 where the launcher left one visible (`CUDA_VISIBLE_DEVICES`
    /// naming one device, as `srun --gpus-per-task=1` sets it), else the local rank.
    pub fn gpu(&self) -> usize {
        let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok();
        let one = visible.is_some_and(|v| !v.trim().is_empty() && !v.contains(','));
        if one { 0 } else { self.local_rank }
    }

    fn check(&self) -> Result<(), DistError> {
        let bad = |what: String| {
            Err(DistError::Inconsistent {
                launcher: self.launcher.name(),
                what,
            })
        };
        if self.size == 0 {
            return bad("a world size of 0".into());
        }
        if self.rank >= self.size {
            return bad(format!("rank {} in a world of {}", self.rank, self.size));
        }
        if self.local_size == 0 || self.local_size > self.size {
            return bad(format!(
                "{} processes on this node in a world of {}",
                self.local_size, self.size
            ));
        }
        if self.local_rank >= self.local_size {
            return bad(format!(
                "local rank {} with {} processes on this node",
                self.local_rank, self.local_size
            ));
        }
        Ok(())
    }
}

struct Vars<'a>(&'a BTreeMap<String, String>);

impl Vars<'_> {
    fn get(&self, name: &str) -> Option<&str> {
        self.0
            .get(name)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
    }

    fn num(&self, name: &'static str, launcher: Launcher) -> Result<Option<usize>, DistError> {
        self.get(name)
            .map(|s| {
                s.trim().parse::<usize>().map_err(|_| DistError::BadVar {
                    name,
                    value: s.to_string(),
                    launcher: launcher.name(),
                })
            })
            .transpose()
    }

    /// `[rank, size, local rank, local size]` of a launcher whose rank variable is set; the
    /// local ones default to a node of one.
    fn four(
        &self,
        l: Launcher,
        [rank, size, local, local_size]: [&'static str; 4],
    ) -> Result<Option<[usize; 4]>, DistError> {
        let Some(r) = self.num(rank, l)? else {
            return match self.get(size) {
                Some(_) => Err(missing(size, rank, l)),
                None => Ok(None),
            };
        };
        let s = self.num(size, l)?.ok_or_else(|| missing(rank, size, l))?;
        let lr = self.num(local, l)?;
        let ls = self.num(local_size, l)?;
        Ok(Some([r, s, lr.unwrap_or(0), ls.unwrap_or(1)]))
    }

    fn open_mpi(&self) -> Result<Option<Launch>, DistError> {
        let l = Launcher::OpenMpi;
        let names = [
            "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE",
        ];
        Ok(self.four(l, names)?.map(|n| launch(l, n, None, None)))
    }

    fn mpich(&self) -> Result<Option<Launch>, DistError> {
        let l = Launcher::Mpich;
        let names = ["PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"];
        Ok(self.four(l, names)?.map(|n| launch(l, n, None, None)))
    }

    fn torchrun(&self) -> Result<Option<Launch>, DistError> {
        let l = Launcher::Torchrun;
        let names = ["RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"];
        let Some(n) = self.four(l, names)? else {
            return Ok(None);
        };
        let port = match self.num("MASTER_PORT", l)? {
            Some(p) => Some(u16::try_from(p).map_err(|_| DistError::BadVar {
                name: "MASTER_PORT",
                value: p.to_string(),
                launcher: l.name(),
            })?),
            None => None,
        };
        let master = self.get("MASTER_ADDR").map(str::to_string);
        if n[1] > 1 && master.is_none() {
            return Err(missing("WORLD_SIZE", "MASTER_ADDR", l));
        }
        Ok(Some(launch(l, n, master, port)))
    }

    fn slurm(&self) -> Result<Option<Launch>, DistError> {
        let l = Launcher::Slurm;
        if self.get("SLURM_STEP_ID").is_none() {
            return Ok(None);
        }
        let size = match self.get("SLURM_STEP_NUM_TASKS") {
            Some(_) => "SLURM_STEP_NUM_TASKS",
            None => "SLURM_NTASKS",
        };
        let names = [
            "SLURM_PROCID",
            size,
            "SLURM_LOCALID",
            "SLURM_STEP_TASKS_PER_NODE",
        ];
        let mut vars = self.0.clone();
        // "2(x3),1": this node's count, by SLURM_NODEID.
        if let Some(list) = self.get("SLURM_STEP_TASKS_PER_NODE") {
            let node = self.num("SLURM_NODEID", l)?.unwrap_or(0);
            let n = tasks_on_node(list, node).ok_or_else(|| DistError::BadVar {
                name: "SLURM_STEP_TASKS_PER_NODE",
                value: list.to_string(),
                launcher: l.name(),
            })?;
            vars.insert("SLURM_STEP_TASKS_PER_NODE".into(), n.to_string());
        }
        let Some(n) = Vars(&vars).four(l, names)? else {
            return Ok(None);
        };
        let master = self.get("MASTER_ADDR").map(str::to_string).or_else(|| {
            self.get("SLURM_STEP_NODELIST")
                .or_else(|| self.get("SLURM_JOB_NODELIST"))
                .map(first_host)
        });
        let port = self.get("MASTER_PORT").and_then(|p| p.trim().parse().ok());
        Ok(Some(launch(l, n, master, port)))
    }
}

fn missing(present: &'static str, missing: &'static str, l: Launcher) -> DistError {
    DistError::Missing {
        present,
        missing,
        launcher: l.name(),
    }
}

fn launch(
    launcher: Launcher,
    [rank, size, local_rank, local_size]: [usize; 4],
    master: Option<String>,
    master_port: Option<u16>,
) -> Launch {
    Launch {
        launcher,
        rank,
        size,
        local_rank,
        local_size,
        master,
        master_port,
    }
}

/// Node `node`'s entry of Slurm's `SLURM_STEP_TASKS_PER_NODE` (`"2(x3),1"`: nodes 0–2 run 2
/// tasks, node 3 runs 1); None when the list does not name it.
fn tasks_on_node(list: &str, node: usize) -> Option<usize> {
    let mut seen = 0usize;
    for part in list.split(',') {
        let part = part.trim();
        let (count, times) = match part.split_once("(x") {
            Some((c, t)) => (c, t.trim_end_matches(')').trim().parse::<usize>().ok()?),
            None => (part, 1),
        };
        let count = count.trim().parse::<usize>().ok()?;
        seen = seen.checked_add(times)?;
        if node < seen {
            return Some(count);
        }
    }
    None
}

/// The first host of a Slurm node list: `"node[07-09,12],gpu1"` → `"node07"`,
/// `"rack[3-4]-n[1-2]"` → `"rack3-n1"`, `"a,b"` → `"a"`.
pub fn first_host(list: &str) -> String {
    // The first entry: up to the first comma outside brackets.
    let mut depth = 0usize;
    let end = list
        .char_indices()
        .find(|(_, c)| {
            match c {
                '[' => depth += 1,
                ']' => depth = depth.saturating_sub(1),
                _ => {}
            }
            *c == ',' && depth == 0
        })
        .map_or(list.len(), |(i, _)| i);
    let mut rest = list[..end].trim();
    let mut host = String::new();
    while let Some(open) = rest.find('[') {
        host.push_str(&rest[..open]);
        let inside = &rest[open + 1..];
        let close = inside.find(']').unwrap_or(inside.len());
        let first = inside[..close].split([',', '-']).next().unwrap_or("");
        host.push_str(first.trim());
        rest = inside.get(close + 1..).unwrap_or("");
    }
    host.push_str(rest);
    host
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn no_launcher_is_a_world_of_one() {
        let l = Launch::from_vars(&vars(&[("PATH", "/bin")])).unwrap();
        assert_eq!(l, Launch::single());
    }

    #[test]
    fn torchrun_gives_ranks_and_its_master() {
        let l = Launch::from_vars(&vars(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.5"),
            ("MASTER_PORT", "29500"),
        ]))
        .unwrap();
        assert_eq!(l.launcher, Launcher::Torchrun);
        assert_eq!((l.rank, l.size, l.local_rank, l.local_size), (3, 8, 1, 2));
        assert_eq!(l.master.as_deref(), Some("10.0.0.5"));
        assert_eq!(l.master_port, Some(29500));
        assert!(!l.launcher.has_mpi());
    }

    #[test]
    fn open_mpi_and_mpich() {
        let l = Launch::from_vars(&vars(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
        ]))
        .unwrap();
        assert_eq!(
            (l.launcher, l.rank, l.size, l.local_size),
            (Launcher::OpenMpi, 1, 2, 2)
        );
        let l = Launch::from_vars(&vars(&[
            ("PMI_RANK", "0"),
            ("PMI_SIZE", "4"),
            ("MPI_LOCALRANKID", "0"),
            ("MPI_LOCALNRANKS", "4"),
        ]))
        .unwrap();
        assert_eq!((l.launcher, l.rank, l.size), (Launcher::Mpich, 0, 4));
        assert!(l.launcher.has_mpi());
    }

    #[test]
    fn slurm_counts_only_inside_a_step() {
        let batch = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "4")];
        assert_eq!(Launch::from_vars(&vars(&batch)).unwrap(), Launch::single());
        let l = Launch::from_vars(&vars(&[
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "5"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_STEP_NUM_TASKS", "6"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "2(x3)"),
            ("SLURM_STEP_NODELIST", "gpu[07-09]"),
        ]))
        .unwrap();
        assert_eq!(l.launcher, Launcher::Slurm);
        assert_eq!((l.rank, l.size, l.local_rank, l.local_size), (5, 6, 1, 2));
        assert_eq!(l.master.as_deref(), Some("gpu07"));
    }

    /// `mpirun` or `torchrun` inside a Slurm step: their ranks win (the step's variables are
    /// the daemon's or the node's), Slurm names rank 0's host; two launchers that both give
    /// ranks must agree.
    #[test]
    fn launchers_inside_slurm_and_launchers_that_differ() {
        let v = vars(&[
            ("OMPI_COMM_WORLD_RANK", "3"),
            ("OMPI_COMM_WORLD_SIZE", "4"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "1"),
            ("SLURM_NTASKS", "2"),
            ("SLURM_JOB_NODELIST", "n1,n2"),
        ]);
        let l = Launch::from_vars(&v).unwrap();
        assert_eq!((l.launcher, l.rank, l.size), (Launcher::OpenMpi, 3, 4));
        assert_eq!(l.master.as_deref(), Some("n1"));
        let v = vars(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("OMPI_COMM_WORLD_SIZE", "2"),
            ("RANK", "0"),
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
        ]);
        let e = Launch::from_vars(&v).unwrap_err().to_string();
        assert!(
            e.contains("rank 1 of 2") && e.contains("rank 0 of 2"),
            "{e}"
        );
    }

    #[test]
    fn slurm_nodes_of_different_sizes() {
        assert_eq!(tasks_on_node("2(x3),1", 0), Some(2));
        assert_eq!(tasks_on_node("2(x3),1", 2), Some(2));
        assert_eq!(tasks_on_node("2(x3),1", 3), Some(1));
        assert_eq!(tasks_on_node("2(x3),1", 4), None);
        let l = Launch::from_vars(&vars(&[
            ("SLURM_STEP_ID", "0"),
            ("SLURM_PROCID", "2"),
            ("SLURM_NTASKS", "3"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "1"),
            ("SLURM_STEP_TASKS_PER_NODE", "1,2"),
            ("SLURM_STEP_NODELIST", "a,b"),
            ("MASTER_ADDR", "10.1.1.1"),
        ]))
        .unwrap();
        assert_eq!((l.local_rank, l.local_size), (1, 2));
        assert_eq!(l.master.as_deref(), Some("10.1.1.1"));
    }

    #[test]
    fn broken_environments_are_named() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("RANK", "x"), ("WORLD_SIZE", "2")], "RANK=\"x\""),
            (&[("RANK", "0")], "WORLD_SIZE is not"),
            (&[("WORLD_SIZE", "2")], "RANK is not"),
            (
                &[("RANK", "2"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")],
                "rank 2 in a world of 2",
            ),
            (&[("RANK", "0"), ("WORLD_SIZE", "2")], "MASTER_ADDR is not"),
            (&[("PMI_RANK", "0"), ("PMI_SIZE", "0")], "world size of 0"),
            (
                &[
                    ("OMPI_COMM_WORLD_RANK", "0"),
                    ("OMPI_COMM_WORLD_SIZE", "2"),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", "2"),
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "2"),
                ],
                "local rank 2",
            ),
            (
                &[
                    ("RANK", "0"),
                    ("WORLD_SIZE", "2"),
                    ("MASTER_ADDR", "h"),
                    ("MASTER_PORT", "70000"),
                ],
                "MASTER_PORT",
            ),
        ];
        for (v, want) in cases {
            let e = Launch::from_vars(&vars(v)).unwrap_err().to_string();
            assert!(e.contains(want), "{v:?}: {e}");
        }
    }

    #[test]
    fn slurm_node_lists() {
        assert_eq!(first_host("node[07-09,12],gpu1"), "node07");
        assert_eq!(first_host("a1,b2"), "a1");
        assert_eq!(first_host("solo"), "solo");
        assert_eq!(first_host("rack[3-4]-n[1-2]"), "rack3-n1");
        assert_eq!(first_host("c[5]"), "c5");
    }
}
