use super::*;

#[test]
fn secrets_compare_whole() {
    assert!(same_secret("abc", "abc"));
    assert!(!same_secret("abc", "abd"));
    assert!(!same_secret("abc", "abcd"));
    let a = random_token();
    assert_eq!(a.len(), 64);
    assert_ne!(a, random_token());
}

fn job(n: u128) -> Job {
    let id = CommandId::from_uuid(uuid::Uuid::from_u128(n));
    Job {
        command: graph_relay_core::relay::RelayCommand {
            id,
            project: graph_relay_core::ids::ProjectId::parse("p1").expect("project"),
            graph_session_id: graph_relay_core::ids::GraphSessionId::parse(
                "gs_0123456789abcdef0123456789abcdef",
            )
            .expect("session"),
            arguments: Map::new(),
            slug: "g".into(),
            agent: Some(graph_relay_core::ids::AgentId::parse("assistant").expect("agent")),
        },
        execution: graph_relay_core::ids::ExecutionId::parse("exec-1").expect("execution"),
        channel: id.channel(),
    }
}

#[test]
fn the_finished_list_keeps_the_newest_50_and_tracking_is_bounded() {
    let mut board = Board::default();
    for n in 1..=(MAX_FINISHED as u128 + 20) {
        board.track(&job(n));
        board.finish(
            CommandId::from_uuid(uuid::Uuid::from_u128(n)),
            "completed",
            false,
            Timestamp(0),
        );
    }
    assert_eq!(board.finished.len(), MAX_FINISHED);
    let newest = CommandId::from_uuid(uuid::Uuid::from_u128(MAX_FINISHED as u128 + 20));
    assert_eq!(board.finished[0].run.command_id, newest);
    assert_eq!(board.finished[0].run.agent_id.as_deref(), Some("assistant"));
    assert!(board.jobs.is_empty());
    // Runs whose end never comes are forgotten, oldest first.
    for n in 1000..(1000 + MAX_TRACKED as u128 + 5) {
        board.track(&job(n));
    }
    assert_eq!(board.jobs.len(), MAX_TRACKED);
    assert!(
        !board
            .jobs
            .contains_key(&CommandId::from_uuid(uuid::Uuid::from_u128(1000)))
    );
    // An end the console never saw start adds nothing.
    board.finish(
        CommandId::from_uuid(uuid::Uuid::from_u128(1)),
        "failed",
        false,
        Timestamp(0),
    );
    assert_eq!(board.finished[0].run.command_id, newest);
}
