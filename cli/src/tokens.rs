//! The tokens of the configuration file: the development pair `serve`
//! creates on first start, the `token` commands, and finding an agent or
//! device by `NAME` or `OWNER/NAME`.

use std::net::SocketAddr;
use std::path::Path;

use graph_relay_core::catalog::{READ_SCOPE, RUN_SCOPE};
use graph_relay_core::mcp::Caller;
use graph_relay_transport_http::auth::Principal;
use graph_relay_transport_http::auth::{AgentToken, DeviceToken, TokenKind, hash_token, new_token};
use graph_relay_transport_http::config::{ConfigFile, ServerSection};

use crate::CliError;
use crate::command_line::{Kind, TokenCommand};

/// Creates `path` with a development agent and device; prints their tokens once.
pub(crate) fn bootstrap(path: &Path, listen: SocketAddr) -> Result<(), CliError> {
    let agent_token = new_token(TokenKind::Agent);
    let device_token = new_token(TokenKind::Device);
    let file = ConfigFile {
        server: ServerSection::default(),
        oauth: None,
        agents: vec![AgentToken {
            name: "dev-agent".into(),
            owner: "dev".into(),
            projects: vec!["default".into()],
            scopes: vec![READ_SCOPE.into(), RUN_SCOPE.into()],
            token_sha256: hash_token(&agent_token),
            revoked: false,
        }],
        devices: vec![DeviceToken {
            name: "dev-desktop".into(),
            owner: "dev".into(),
            token_sha256: hash_token(&device_token),
            revoked: false,
        }],
    };
    file.save(path)?;
    eprintln!(
        "Created {} with a development agent and device. These tokens are shown ONCE:\n\n  agent  dev-agent    {agent_token}\n  device dev-desktop  {device_token}\n\nConnect an MCP client to http://{listen}/mcp with header\n  Authorization: Bearer {agent_token}\nor over stdio: graph-relay stdio --agent dev-agent --config {}\nConnect a relay (worker) to http://{listen} with the device token.\n",
        path.display(),
        path.display()
    );
    Ok(())
}

/// Which entries a command-line `NAME` or `OWNER/NAME` means: identity is
/// (owner, name), so a bare name that several owners use is refused with
/// the choices spelled out. `entries` are `(owner, name)` pairs; returns
/// the indexes of the matching ones (never empty).
pub(crate) fn select_principals<'a>(
    what: &str,
    target: &str,
    entries: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<Vec<usize>, CliError> {
    let (owner, name) = match target.split_once('/') {
        Some((owner, name)) => (Some(owner), name),
        None => (None, target),
    };
    let mut found = Vec::new();
    let mut owners = std::collections::BTreeSet::new();
    for (index, (o, n)) in entries.enumerate() {
        if n == name && owner.is_none_or(|wanted| wanted == o) {
            found.push(index);
            owners.insert(o);
        }
    }
    if found.is_empty() {
        return Err(CliError::Usage(format!(
            "no {what} `{target}` in the configuration"
        )));
    }
    if owners.len() > 1 {
        let choices: Vec<String> = owners.iter().map(|o| format!("{o}/{name}")).collect();
        return Err(CliError::Usage(format!(
            "{what} `{name}` exists for several owners; say which: {}",
            choices.join(", ")
        )));
    }
    Ok(found)
}

/// The active agent `name` (or `OWNER/NAME`) of `file`, as the caller
/// its token authenticates.
pub(crate) fn find_agent(file: &ConfigFile, name: &str) -> Result<Caller, CliError> {
    let active: Vec<&AgentToken> = file.agents.iter().filter(|a| !a.revoked).collect();
    let picked = select_principals(
        "agent",
        name,
        active.iter().map(|a| (a.owner.as_str(), a.name.as_str())),
    )
    .map_err(|e| match e {
        CliError::Usage(text) if text.starts_with("no agent") => CliError::Usage(format!(
            "{text} (create one with `graph-relay token create agent {name}`)"
        )),
        other => other,
    })?;
    let entry = active[picked[0]];
    let one = graph_relay_transport_http::auth::TokenConfig {
        agents: vec![entry.clone()],
        devices: vec![],
    };
    match one.principals()?.into_values().next() {
        Some(Principal::Agent(caller)) => Ok(caller),
        _ => Err(CliError::Usage(format!("agent `{name}` is not usable"))),
    }
}

/// `graph-relay token`: creates, lists or revokes the tokens of the file at
/// `config_path` (created when missing).
pub(crate) fn token(config_path: &Path, command: TokenCommand) -> Result<(), CliError> {
    let mut file = if config_path.exists() {
        ConfigFile::load(config_path)?
    } else {
        ConfigFile::default()
    };
    match command {
        TokenCommand::Create {
            kind,
            name,
            owner,
            projects,
            scopes,
        } => create_token(&mut file, config_path, kind, name, owner, projects, scopes),
        TokenCommand::Operator => {
            let token = new_token(TokenKind::Operator);
            file.server.operator_token_sha256 = Some(hash_token(&token));
            file.save(config_path)?;
            eprintln!(
                "Created the operator token in {} (serve reads it at start). It is shown once:",
                config_path.display()
            );
            println!("{token}");
            Ok(())
        }
        TokenCommand::List => {
            list_tokens(&file);
            Ok(())
        }
        TokenCommand::Revoke { target } => revoke_tokens(&mut file, config_path, &target),
    }
}

/// `token create`: a new agent or device token, validated with the rest
/// of the file before it is written, and shown once.
fn create_token(
    file: &mut ConfigFile,
    config_path: &Path,
    kind: Kind,
    name: String,
    owner: String,
    projects: Vec<String>,
    scopes: Vec<String>,
) -> Result<(), CliError> {
    let (token, kind_name) = match kind {
        Kind::Agent => {
            let token = new_token(TokenKind::Agent);
            file.agents.push(AgentToken {
                name: name.clone(),
                owner,
                projects: if projects.is_empty() {
                    vec!["default".into()]
                } else {
                    projects
                },
                scopes: if scopes.is_empty() {
                    vec![READ_SCOPE.into(), RUN_SCOPE.into()]
                } else {
                    scopes
                },
                token_sha256: hash_token(&token),
                revoked: false,
            });
            (token, "agent")
        }
        Kind::Device => {
            let token = new_token(TokenKind::Device);
            file.devices.push(DeviceToken {
                name: name.clone(),
                owner,
                token_sha256: hash_token(&token),
                revoked: false,
            });
            (token, "device")
        }
    };
    // Validate before writing.
    graph_relay_transport_http::auth::TokenConfig {
        agents: file.agents.clone(),
        devices: file.devices.clone(),
    }
    .principals()?;
    file.save(config_path)?;
    eprintln!(
        "Created {kind_name} token for `{name}` in {}. It is shown once:",
        config_path.display()
    );
    println!("{token}");
    Ok(())
}

/// `token list`: every token of the file, active or revoked.
fn list_tokens(file: &ConfigFile) {
    println!(
        "{:<7} {:<24} {:<16} {:<14} {:<8} scopes/projects",
        "kind", "name", "owner", "hash", "state"
    );
    for a in &file.agents {
        println!(
            "{:<7} {:<24} {:<16} {:<14} {:<8} {} / {}",
            "agent",
            a.name,
            a.owner,
            &a.token_sha256[..12.min(a.token_sha256.len())],
            if a.revoked { "revoked" } else { "active" },
            a.scopes.join(" "),
            a.projects.join(" ")
        );
    }
    for d in &file.devices {
        println!(
            "{:<7} {:<24} {:<16} {:<14} {:<8}",
            "device",
            d.name,
            d.owner,
            &d.token_sha256[..12.min(d.token_sha256.len())],
            if d.revoked { "revoked" } else { "active" }
        );
    }
}

/// `token revoke`: by hash prefix, or every active token of one (owner,
/// name).
fn revoke_tokens(file: &mut ConfigFile, config_path: &Path, target: &str) -> Result<(), CliError> {
    let by_hash = target.len() >= 8 && target.bytes().all(|b| b.is_ascii_hexdigit());
    let mut count = 0;
    if by_hash {
        for a in file
            .agents
            .iter_mut()
            .filter(|a| a.token_sha256.starts_with(target) && !a.revoked)
        {
            a.revoked = true;
            count += 1;
        }
        for d in file
            .devices
            .iter_mut()
            .filter(|d| d.token_sha256.starts_with(target) && !d.revoked)
        {
            d.revoked = true;
            count += 1;
        }
    }
    if count == 0 {
        // By name: every active token of one (owner, name), agents
        // and devices alike; a name several owners use needs its owner.
        let agents: Vec<usize> = (0..file.agents.len())
            .filter(|&i| !file.agents[i].revoked)
            .collect();
        let devices: Vec<usize> = (0..file.devices.len())
            .filter(|&i| !file.devices[i].revoked)
            .collect();
        let entries = agents
            .iter()
            .map(|&i| (file.agents[i].owner.as_str(), file.agents[i].name.as_str()))
            .chain(devices.iter().map(|&i| {
                (
                    file.devices[i].owner.as_str(),
                    file.devices[i].name.as_str(),
                )
            }));
        let picked = match select_principals("token", target, entries) {
            Ok(picked) => picked,
            Err(CliError::Usage(text)) if text.starts_with("no token") => Vec::new(),
            Err(e) => return Err(e),
        };
        for index in picked {
            match agents.get(index) {
                Some(&i) => file.agents[i].revoked = true,
                None => file.devices[devices[index - agents.len()]].revoked = true,
            }
            count += 1;
        }
    }
    if count == 0 {
        return Err(CliError::Usage(format!(
            "no active token matches `{target}`"
        )));
    }
    file.save(config_path)?;
    eprintln!("Revoked {count} token(s); a running server picks this up within seconds.");
    Ok(())
}
