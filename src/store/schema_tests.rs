//! A new database (created at the current version in one step) and a
//! version-1 database migrated step by step end with the same schema.

use rusqlite::Connection;

use super::{migrate, user_version, SCHEMA_VERSION, V1};

/// Every table and index: its name and its SQL with whitespace removed
/// (an `ALTER TABLE … ADD COLUMN` splices its column into the stored
/// `CREATE TABLE` text with its own spacing), plus each table's columns as
/// `PRAGMA table_info` reports them (name, type, not null, default, pk).
fn schema(conn: &Connection) -> Vec<String> {
    let mut stmt = conn
        .prepare("SELECT type, name, sql FROM sqlite_master WHERE sql IS NOT NULL ORDER BY type, name")
        .unwrap();
    let objects: Vec<(String, String, String)> = stmt
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    let mut out = Vec::new();
    for (kind, name, sql) in objects {
        let squeezed: String = sql.chars().filter(|c| !c.is_whitespace()).collect();
        out.push(format!("{kind} {name}: {squeezed}"));
        if kind == "table" {
            let mut info = conn
                .prepare("SELECT name, type, \"notnull\", dflt_value, pk FROM pragma_table_info(?1)")
                .unwrap();
            let columns = info
                .query_map([&name], |r| {
                    Ok(format!(
                        "{name}.{}: {} notnull={} default={:?} pk={}",
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, Option<String>>(3)?,
                        r.get::<_, i64>(4)?
                    ))
                })
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            out.extend(columns);
        }
    }
    out
}

#[test]
fn a_new_database_and_a_migrated_version_1_database_have_the_same_schema() {
    let fresh = Connection::open_in_memory().unwrap();
    assert_eq!(migrate(&fresh, "fresh").unwrap(), 0);

    let old = Connection::open_in_memory().unwrap();
    old.execute_batch(V1).unwrap();
    old.pragma_update(None, "user_version", 1).unwrap();
    assert_eq!(migrate(&old, "old").unwrap(), 1);

    assert_eq!(user_version(&fresh).unwrap(), SCHEMA_VERSION);
    assert_eq!(user_version(&old).unwrap(), SCHEMA_VERSION);
    let (fresh, old) = (schema(&fresh), schema(&old));
    assert!(fresh.iter().any(|l| l.starts_with("runs.job_json")), "{fresh:#?}");
    assert!(
        fresh.iter().any(|l| l.starts_with("tool_call_attempts.attempt")),
        "{fresh:#?}"
    );
    assert!(
        fresh
            .iter()
            .any(|l| l.starts_with("token_usage.model: TEXT notnull=0")),
        "{fresh:#?}"
    );
    assert_eq!(fresh, old);
}

#[test]
fn a_version_2_database_migrates_to_the_current_schema() {
    let fresh = Connection::open_in_memory().unwrap();
    migrate(&fresh, "fresh").unwrap();
    // A version-2 database: version 1 and the v2 columns, no v3 table.
    let v2 = Connection::open_in_memory().unwrap();
    v2.execute_batch(V1).unwrap();
    v2.execute_batch(super::V2).unwrap();
    v2.pragma_update(None, "user_version", 2).unwrap();
    assert_eq!(migrate(&v2, "v2").unwrap(), 2);
    assert_eq!(user_version(&v2).unwrap(), SCHEMA_VERSION);
    assert_eq!(schema(&fresh), schema(&v2));
}

#[test]
fn a_version_3_database_migrates_to_the_current_schema_and_keeps_its_usage_rows() {
    let fresh = Connection::open_in_memory().unwrap();
    migrate(&fresh, "fresh").unwrap();
    // A version-3 database: versions 1 to 3, no model per usage row, and
    // a usage row written by that build.
    let v3 = Connection::open_in_memory().unwrap();
    v3.execute_batch(V1).unwrap();
    v3.execute_batch(super::V2).unwrap();
    v3.execute_batch(super::V3).unwrap();
    v3.execute_batch(
        "INSERT INTO token_usage (session_id, agent_id, turn, input_tokens, output_tokens, created_at) \
         VALUES ('s', 'a', 0, 10, 2, 5)",
    )
    .unwrap();
    v3.pragma_update(None, "user_version", 3).unwrap();
    assert_eq!(migrate(&v3, "v3").unwrap(), 3);
    assert_eq!(user_version(&v3).unwrap(), SCHEMA_VERSION);
    assert_eq!(schema(&fresh), schema(&v3));
    // The old row is kept, its model unknown (never guessed).
    let row: (u64, Option<String>) = v3
        .query_row("SELECT input_tokens, model FROM token_usage", [], |r| {
            Ok((r.get(0)?, r.get(1)?))
        })
        .unwrap();
    assert_eq!(row, (10, None));
}

#[test]
fn every_older_schema_migrates_to_the_current_one() {
    let fresh = Connection::open_in_memory().unwrap();
    migrate(&fresh, "fresh").unwrap();
    for version in 1..SCHEMA_VERSION {
        let old = Connection::open_in_memory().unwrap();
        old.execute_batch(&super::older_schema(version).unwrap()).unwrap();
        old.pragma_update(None, "user_version", version).unwrap();
        assert_eq!(migrate(&old, "old").unwrap(), version);
        assert_eq!(schema(&fresh), schema(&old), "from version {version}");
    }
    let current = Connection::open_in_memory().unwrap();
    current
        .execute_batch(&super::older_schema(SCHEMA_VERSION).unwrap())
        .unwrap();
    assert_eq!(
        schema(&fresh),
        schema(&current),
        "every step is the current schema"
    );
    assert_eq!(super::older_schema(0), None);
    assert_eq!(super::older_schema(SCHEMA_VERSION + 1), None);
}
