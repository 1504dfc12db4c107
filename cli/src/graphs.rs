//! `graphs.toml`: the Graphs a desktop shares, and how to run each one.
//!
//! ```toml
//! # Projects enabled on this desktop even if no Graph is shared to them now
//! # (a command queued there is then closed by the re-check instead of waiting).
//! projects = ["default"]
//!
//! [[graph]]
//! id = "gs_0123456789abcdef0123456789abcdef"
//! name = "Draft replies"
//! description = "Drafts replies to unread mail"
//! slug = "draft-replies"
//! version = "3"
//! projects = ["default"]
//! command = ["/usr/bin/env", "python3", "draft.py"]   # argv, no shell
//! working_dir = "/home/me/graphs"                       # optional; relative to this file's folder
//! timeout_seconds = 600                                 # optional; default 3600
//! env = { MODEL = "local" }                             # optional
//! approval = "always"                                   # optional; "never" by default
//! approval_timeout_seconds = 600                        # optional; default 600
//! approval_command = ["./ask.sh"]                       # optional; exit 0 approves
//! ```
//!
//! A Graph with `approval = "always"` waits, before each run, for the
//! owner's approval on the desktop (see [`crate::approval`]); the server
//! never sees this setting.
//!
//! A program given as a relative path (`./draft.sh`, `bin/draft`) is
//! resolved against the folder of this file, like `working_dir`, whatever
//! the worker's current directory; a bare name (`python3`) is looked up in
//! `PATH`. Arguments are passed as written.
//!
//! The file is re-read when its modification time or size changes
//! ([`watch`]); an edit that does not parse is logged and the previous set
//! kept.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use graph_relay_core::ids::{GraphSessionId, ProjectId};
use graph_relay_core::relay::SharedSet;
use graph_relay_core::relay::driver::SharedSetSender;
use graph_relay_core::session::SessionMeta;
use serde::Deserialize;

/// Default run time limit of a Graph.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3600);
/// Default wait for the owner's approval.
pub const DEFAULT_APPROVAL_TIMEOUT: Duration = Duration::from_secs(600);
/// Longest wait for the owner's approval that may be configured (24 h).
pub const MAX_APPROVAL_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Whether a Graph's runs wait for the owner's approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ApprovalForm {
    #[default]
    Never,
    Always,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileForm {
    #[serde(default)]
    projects: Vec<String>,
    #[serde(default, rename = "graph")]
    graphs: Vec<GraphForm>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphForm {
    id: String,
    name: String,
    #[serde(default)]
    description: String,
    slug: String,
    #[serde(default)]
    version: String,
    #[serde(default = "ready")]
    status: String,
    #[serde(default)]
    projects: Vec<String>,
    command: Vec<String>,
    working_dir: Option<PathBuf>,
    timeout_seconds: Option<u64>,
    #[serde(default)]
    env: BTreeMap<String, String>,
    #[serde(default)]
    approval: ApprovalForm,
    approval_timeout_seconds: Option<u64>,
    approval_command: Option<Vec<String>>,
}

fn ready() -> String {
    "ready".into()
}

/// How to run one Graph.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphSpec {
    /// argv: program and arguments (no shell). A relative program path is
    /// already resolved against the graphs file's folder.
    pub command: Vec<String>,
    /// Working directory (absolute, or relative to the graphs file's folder).
    pub working_dir: Option<PathBuf>,
    /// Run time limit; the run fails when it passes.
    pub timeout: Duration,
    /// Extra environment variables.
    pub env: BTreeMap<String, String>,
    /// Whether and how each run waits for the owner's approval.
    pub approval: Option<ApprovalSpec>,
}

/// How a Graph's runs wait for the owner's approval.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalSpec {
    /// How long a run waits before it fails.
    pub timeout: Duration,
    /// A hook asked for each run (argv; exit 0 approves, anything else
    /// declines), its program already resolved like `command`'s.
    pub command: Option<Vec<String>>,
}

/// The parsed file: what is shared, and how to run each Graph.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Graphs {
    /// The consent the relay syncs and re-checks.
    pub shared: SharedSet,
    /// Run specifications by session id.
    pub specs: HashMap<GraphSessionId, GraphSpec>,
}

/// Why the graphs file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum GraphsError {
    /// Reading failed.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Not TOML of the expected shape.
    #[error("{path}: {source}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// Why.
        source: Box<toml::de::Error>,
    },
    /// A value breaks a rule.
    #[error("{path}: graph `{graph}`: {problem}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The graph id or name.
        graph: String,
        /// What is wrong.
        problem: String,
    },
}

impl Graphs {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Self, GraphsError> {
        let text = std::fs::read_to_string(path).map_err(|source| GraphsError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses `text` (read from `path`, used in errors and for relative folders).
    pub fn parse(path: &Path, text: &str) -> Result<Self, GraphsError> {
        let form: FileForm = toml::from_str(text).map_err(|source| GraphsError::Parse {
            path: path.to_owned(),
            source: Box::new(source),
        })?;
        let invalid = |graph: &str, problem: String| GraphsError::Invalid {
            path: path.to_owned(),
            graph: graph.to_owned(),
            problem,
        };
        let base = folder_of(path);
        let mut graphs = Graphs::default();
        for p in &form.projects {
            let project = ProjectId::parse(p).map_err(|e| invalid("(projects)", e.to_string()))?;
            graphs.shared.enable(project);
        }
        for (index, g) in form.graphs.into_iter().enumerate() {
            let id = GraphSessionId::parse(&g.id).map_err(|e| invalid(&g.id, e.to_string()))?;
            if graphs.specs.contains_key(&id) {
                return Err(invalid(&g.id, "declared twice".into()));
            }
            if g.command.first().is_none_or(|p| p.is_empty()) {
                return Err(invalid(&g.id, "`command` needs at least a program".into()));
            }
            let mut command = g.command;
            command[0] =
                resolve_program(&base, &command[0]).map_err(|problem| invalid(&g.id, problem))?;
            let meta = SessionMeta {
                graph_session_id: id.clone(),
                name: g.name.into(),
                description: g.description.into(),
                slug: g.slug.into(),
                version: g.version.into(),
                status: g.status.into(),
            };
            meta.validate(index)
                .map_err(|e| invalid(&g.id, e.to_string()))?;
            for p in &g.projects {
                let project = ProjectId::parse(p).map_err(|e| invalid(&g.id, e.to_string()))?;
                graphs.shared.share(project, meta.clone());
            }
            let approval = approval_spec(
                g.approval,
                g.approval_timeout_seconds,
                g.approval_command,
                &base,
                |problem| invalid(&g.id, problem),
            )?;
            if let Some(spec) = &approval {
                graphs.shared.require_approval(id.clone(), spec.timeout);
            }
            graphs.specs.insert(
                id,
                GraphSpec {
                    command,
                    working_dir: g.working_dir.map(|d| base.join(d)),
                    timeout: g
                        .timeout_seconds
                        .map_or(DEFAULT_TIMEOUT, Duration::from_secs),
                    env: g.env,
                    approval,
                },
            );
        }
        Ok(graphs)
    }
}

/// The approval a Graph declares: none, or the owner's, within a timeout
/// (1 s to [`MAX_APPROVAL_TIMEOUT`]) and optionally asked by a command
/// (its program resolved from `base`, as the Graph's own).
fn approval_spec(
    approval: ApprovalForm,
    timeout_seconds: Option<u64>,
    approval_command: Option<Vec<String>>,
    base: &Path,
    invalid: impl Fn(String) -> GraphsError,
) -> Result<Option<ApprovalSpec>, GraphsError> {
    match approval {
        ApprovalForm::Never => {
            if approval_command.is_some() || timeout_seconds.is_some() {
                return Err(invalid(
                    "`approval_command` and `approval_timeout_seconds` need `approval = \"always\"`".into(),
                ));
            }
            Ok(None)
        }
        ApprovalForm::Always => {
            let timeout = timeout_seconds.map_or(DEFAULT_APPROVAL_TIMEOUT, Duration::from_secs);
            if timeout.is_zero() || timeout > MAX_APPROVAL_TIMEOUT {
                return Err(invalid(format!(
                    "`approval_timeout_seconds` must be from 1 to {}",
                    MAX_APPROVAL_TIMEOUT.as_secs()
                )));
            }
            let command = match approval_command {
                None => None,
                Some(mut argv) => {
                    if argv.first().is_none_or(|p| p.is_empty()) {
                        return Err(invalid(
                            "`approval_command` needs at least a program".into(),
                        ));
                    }
                    argv[0] = resolve_program(base, &argv[0]).map_err(&invalid)?;
                    Some(argv)
                }
            };
            Ok(Some(ApprovalSpec { timeout, command }))
        }
    }
}

/// The folder of the graphs file at `path`, absolute when it can be made
/// so (a relative `--graphs` is taken from the worker's current directory
/// once, when the file is read, not when a Graph starts).
fn folder_of(path: &Path) -> PathBuf {
    let folder = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    std::path::absolute(folder).unwrap_or_else(|_| folder.to_owned())
}

/// `program` as the executor must start it: a relative path (one with a
/// `/`, such as `./echo.sh`) joined to the graphs file's folder `base`; an
/// absolute path or a bare name (looked up in `PATH`) as written.
fn resolve_program(base: &Path, program: &str) -> Result<String, String> {
    let as_path = Path::new(program);
    if as_path.is_absolute() || !program.contains('/') {
        return Ok(program.to_owned());
    }
    // `components` drops the `.` parts: `/etc/./echo.sh` becomes `/etc/echo.sh`.
    let joined: PathBuf = base.join(as_path).components().collect();
    joined
        .into_os_string()
        .into_string()
        .map_err(|_| format!("the program path `{program}` is not valid UTF-8 once resolved"))
}

/// The current run specifications, shared with the executor.
pub type SpecTable = Arc<RwLock<HashMap<GraphSessionId, GraphSpec>>>;

fn stamp(path: &Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Polls `path` every `every`; on a valid change publishes the new shared set
/// on `shared` and the new specifications in `specs`, and calls `report`
/// with a status line. Runs until `shared` has no receiver left.
pub async fn watch(
    path: PathBuf,
    every: Duration,
    shared: SharedSetSender,
    specs: SpecTable,
    mut report: impl FnMut(String) + Send,
) {
    let mut last = stamp(&path);
    loop {
        tokio::time::sleep(every).await;
        let now = stamp(&path);
        if now == last {
            continue;
        }
        last = now;
        match Graphs::load(&path) {
            Ok(graphs) => {
                let count = graphs.specs.len();
                if let Ok(mut table) = specs.write() {
                    *table = graphs.specs;
                }
                let warning = nothing_shared_warning(&path, &graphs.shared);
                if !shared.send(graphs.shared) {
                    // The driver has ended.
                    return;
                }
                report(format!(
                    "graphs: reloaded {} ({count} graph(s))",
                    path.display()
                ));
                if let Some(warning) = warning {
                    report(warning);
                }
            }
            Err(e) => report(format!("graphs: {e}; keeping the previous set")),
        }
    }
}

/// The warning for a graphs file that shares no Graph with any project
/// (none declared, or none listing a project): agents then see no sessions.
pub fn nothing_shared_warning(path: &Path, shared: &SharedSet) -> Option<String> {
    if shared.projects().any(|p| !shared.sessions(p).is_empty()) {
        return None;
    }
    Some(format!(
        "warning: {} shares no Graph: agents will see no sessions until a [[graph]] in it lists a project (see \"Writing a Graph script\" in the README)",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const GS: &str = "gs_0123456789abcdef0123456789abcdef";

    #[test]
    fn a_graph_is_shared_to_its_projects_and_keeps_its_run_spec() {
        let text = format!(
            r#"
projects = ["spare"]
[[graph]]
id = "{GS}"
name = "Drafts"
slug = "drafts"
projects = ["p1"]
command = ["sh", "run.sh"]
working_dir = "work"
timeout_seconds = 5
env = {{ A = "b" }}
"#
        );
        let g = Graphs::parse(Path::new("/etc/graphs.toml"), &text).unwrap();
        let p1 = ProjectId::parse("p1").unwrap();
        let gs = GraphSessionId::parse(GS).unwrap();
        assert!(g.shared.still_shared(&p1, &gs, "drafts"));
        assert!(!g.shared.still_shared(&p1, &gs, "renamed"));
        assert_eq!(g.shared.projects().count(), 2, "spare is enabled too");
        let spec = &g.specs[&gs];
        assert_eq!(spec.working_dir.as_deref(), Some(Path::new("/etc/work")));
        assert_eq!(spec.timeout, Duration::from_secs(5));
        assert_eq!(spec.env["A"], "b");
    }

    #[test]
    fn a_relative_program_resolves_against_the_folder_of_the_file() {
        let graph = |program: &str| {
            format!(
                "[[graph]]\nid = \"{GS}\"\nname = \"a\"\nslug = \"a\"\ncommand = [\"{program}\", \"./arg\"]\n"
            )
        };
        let gs = GraphSessionId::parse(GS).unwrap();
        let program = |path: &str, program: &str| {
            Graphs::parse(Path::new(path), &graph(program))
                .unwrap()
                .specs[&gs]
                .command
                .clone()
        };
        assert_eq!(
            program("/etc/relay/graphs.toml", "./echo.sh"),
            ["/etc/relay/echo.sh", "./arg"],
            "only the program is resolved"
        );
        assert_eq!(
            program("/etc/relay/graphs.toml", "bin/run"),
            ["/etc/relay/bin/run", "./arg"]
        );
        assert_eq!(
            program("/etc/relay/graphs.toml", "../tools/run"),
            ["/etc/relay/../tools/run", "./arg"]
        );
        assert_eq!(program("/etc/relay/graphs.toml", "/bin/sh")[0], "/bin/sh");
        assert_eq!(
            program("/etc/relay/graphs.toml", "python3")[0],
            "python3",
            "PATH"
        );
        // A relative graphs file: its folder as seen from the current directory.
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            program("graphs.toml", "./echo.sh")[0],
            cwd.join("echo.sh").to_str().unwrap()
        );
        assert_eq!(
            program("conf/graphs.toml", "./echo.sh")[0],
            cwd.join("conf/echo.sh").to_str().unwrap()
        );
    }

    #[test]
    fn approval_is_read_per_graph_with_its_timeout_and_hook() {
        let gs = GraphSessionId::parse(GS).unwrap();
        let graph = |extra: &str| {
            format!(
                "[[graph]]\nid = \"{GS}\"\nname = \"a\"\nslug = \"a\"\nprojects = [\"p1\"]\ncommand = [\"x\"]\n{extra}"
            )
        };
        let path = Path::new("/etc/relay/graphs.toml");
        let never = Graphs::parse(path, &graph("")).unwrap();
        assert_eq!(never.specs[&gs].approval, None);
        assert_eq!(never.shared.approval(&gs), None);
        let always = Graphs::parse(path, &graph("approval = \"always\"\n")).unwrap();
        assert_eq!(
            always.specs[&gs].approval,
            Some(ApprovalSpec {
                timeout: DEFAULT_APPROVAL_TIMEOUT,
                command: None
            })
        );
        assert_eq!(always.shared.approval(&gs), Some(DEFAULT_APPROVAL_TIMEOUT));
        let hooked = Graphs::parse(
            path,
            &graph(
                "approval = \"always\"\napproval_timeout_seconds = 30\napproval_command = [\"./ask.sh\", \"--quiet\"]\n",
            ),
        )
        .unwrap();
        assert_eq!(
            hooked.specs[&gs].approval,
            Some(ApprovalSpec {
                timeout: Duration::from_secs(30),
                command: Some(vec!["/etc/relay/ask.sh".into(), "--quiet".into()])
            })
        );
        for bad in [
            "approval = \"sometimes\"\n",
            "approval = \"always\"\napproval_timeout_seconds = 0\n",
            "approval = \"always\"\napproval_timeout_seconds = 86401\n",
            "approval = \"always\"\napproval_command = []\n",
            "approval_command = [\"./ask.sh\"]\n",
            "approval_timeout_seconds = 5\n",
        ] {
            assert!(Graphs::parse(path, &graph(bad)).is_err(), "{bad}");
        }
    }

    #[test]
    fn invalid_files_are_refused_with_the_reason() {
        let p = Path::new("g.toml");
        assert!(Graphs::parse(p, "[[graph]]\nid = 1").is_err());
        let bad_id = "[[graph]]\nid = \"gs_x\"\nname = \"a\"\nslug = \"a\"\ncommand = [\"x\"]";
        assert!(matches!(
            Graphs::parse(p, bad_id),
            Err(GraphsError::Invalid { .. })
        ));
        let no_cmd = format!("[[graph]]\nid = \"{GS}\"\nname = \"a\"\nslug = \"a\"\ncommand = []");
        assert!(matches!(
            Graphs::parse(p, &no_cmd),
            Err(GraphsError::Invalid { .. })
        ));
    }
}
