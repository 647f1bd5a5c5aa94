//! The module store against every SQL database it lives in: SQLite (a temp
//! file), Postgres and MariaDB (`SLUICE_TEST_POSTGRES_URL`,
//! `SLUICE_TEST_MYSQL_URL`, default the local servers), one schema each,
//! dropped first. The sink opens first, as in `sluice run`.

use crate::SqlModuleStore;
use crate::scenarios::{COUNTS, sink_config};
use crate::{mysql, postgres, sqlite};
use sluice_core::store::{Activation, ModuleStore, StoreError};

const PIPELINE: &str = "store-test";

/// put/get, seed once, activate, params as versions, rollback, history.
async fn lifecycle(store: &dyn ModuleStore) {
    let a = store.put(b"component a").await.unwrap();
    let b = store.put(b"component b").await.unwrap();
    assert_eq!(
        store.put(b"component a").await.unwrap(),
        a,
        "content-addressed"
    );
    assert_eq!(store.get(&a).await.unwrap(), b"component a");
    assert!(matches!(
        store.get(&"0".repeat(64)).await,
        Err(StoreError::UnknownModule(_))
    ));
    assert!(store.active(PIPELINE).await.unwrap().is_none());
    assert!(matches!(
        store.rollback(PIPELINE).await,
        Err(StoreError::NothingToRollBack(_))
    ));

    let seeded = store.seed(PIPELINE, &a, "{}").await.unwrap();
    assert_eq!((seeded.version, seeded.action.as_str()), (1, "seed"));
    let again = store.seed(PIPELINE, &b, "{}").await.unwrap();
    assert_eq!(again, seeded, "a second seed keeps the first");

    let v2 = store
        .activate(PIPELINE, &b, r#"{"x":1}"#, Activation::Activate)
        .await
        .unwrap();
    let v3 = store
        .activate(PIPELINE, &b, r#"{"x":2}"#, Activation::Activate)
        .await
        .unwrap();
    assert_eq!((v2.version, v3.version), (2, 3));
    assert_eq!(store.active(PIPELINE).await.unwrap().as_ref(), Some(&v3));
    let back = store.rollback(PIPELINE).await.unwrap();
    assert_eq!((back.version, back.module_digest.as_str()), (4, b.as_str()));
    assert_eq!(
        back.params, r#"{"x":1}"#,
        "rollback restores the previous params"
    );
    assert!(matches!(
        store
            .activate(PIPELINE, &"f".repeat(64), "{}", Activation::Activate)
            .await,
        Err(StoreError::UnknownModule(_))
    ));

    let history = store.history(PIPELINE).await.unwrap();
    let actions: Vec<&str> = history.iter().map(|v| v.action.as_str()).collect();
    assert_eq!(actions, ["seed", "activate", "activate", "rollback"]);
    let summary = store.summary(PIPELINE).await.unwrap();
    assert_eq!(summary.len(), 3, "a, b{{x:1}}, b{{x:2}}");
    assert!(summary.iter().filter(|s| s.active).count() == 1);
    assert_eq!(
        store
            .params_for(PIPELINE, &v3.params_digest)
            .await
            .unwrap()
            .as_deref(),
        Some(r#"{"x":2}"#)
    );
}

#[tokio::test]
async fn store_lifecycle_on_sqlite() {
    let dir = std::env::temp_dir().join(format!("sluice-store-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let url = format!("sqlite://{}", dir.join("sink.db").display());
    let config = sink_config(&url, None, "", COUNTS);
    sqlite::open(&config).await.unwrap();
    lifecycle(&SqlModuleStore::open(&config.store()).await.unwrap()).await;
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn store_lifecycle_on_postgres() {
    let url = std::env::var("SLUICE_TEST_POSTGRES_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
    let schema = "sluice_ut_store";
    let pool = sqlx::PgPool::connect(&url).await.expect("Postgres is up");
    sqlx::raw_sql(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
    let config = sink_config(&url, Some(schema), "", COUNTS);
    postgres::open(&config).await.unwrap();
    lifecycle(&SqlModuleStore::open(&config.store()).await.unwrap()).await;
}

#[tokio::test]
async fn store_lifecycle_on_mariadb() {
    let url = std::env::var("SLUICE_TEST_MYSQL_URL")
        .unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into());
    let schema = "sluice_ut_store";
    let pool = sqlx::MySqlPool::connect(&url).await.expect("MariaDB is up");
    sqlx::raw_sql(&format!("DROP DATABASE IF EXISTS `{schema}`"))
        .execute(&pool)
        .await
        .unwrap();
    let config = sink_config(&url, Some(schema), "", COUNTS);
    mysql::open(&config).await.unwrap();
    lifecycle(&SqlModuleStore::open(&config.store()).await.unwrap()).await;
}
