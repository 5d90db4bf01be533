use super::*;

fn args(url: Option<&str>) -> ClusterArgs {
    ClusterArgs {
        redis_url: url.map(str::to_owned),
        redis_prefix: keys::DEFAULT_PREFIX.to_owned(),
        node_name: Some("node-a".to_owned()),
        redis_queue: 16,
        ..ClusterArgs::default()
    }
}

#[test]
fn the_password_never_shows() {
    let url = RedisUrl::parse("redis://observer:s3cret-pw@redis.chat:6380/2").unwrap();
    assert_eq!(url.to_string(), "redis://observer@redis.chat:6380/2");
    assert!(!format!("{url:?}").contains("s3cret-pw"));
    assert_eq!(
        url.scrub("failed: redis://observer:s3cret-pw@x"),
        "failed: redis://observer:***@x"
    );
    let tls = RedisUrl::parse("rediss://:pw@redis:6390").unwrap();
    assert_eq!(tls.to_string(), "rediss://redis:6390/0");
}

#[test]
fn bad_urls_are_refused_without_echoing_them() {
    for bad in [
        "http://user:pw@host",
        "redis-pw-host",
        "unix:///tmp/redis.sock",
    ] {
        let error = RedisUrl::parse(bad).unwrap_err().to_string();
        assert!(!error.contains("pw"), "{error}");
        assert!(error.starts_with("invalid Redis URL"), "{error}");
    }
}

#[test]
fn the_url_comes_from_the_flag_then_the_file() {
    if std::env::var_os(REDIS_URL_ENV).is_none() {
        assert!(args(None).resolve().unwrap().is_none());
    }
    let config = args(Some("redis://127.0.0.1:7000"))
        .resolve()
        .unwrap()
        .unwrap();
    assert_eq!(config.node, "node-a");
    assert_eq!(
        config.redis.to_string(),
        "Redis at redis://127.0.0.1:7000/0"
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("url");
    std::fs::write(&path, "redis://u:p@10.0.0.1:6379/1\n").unwrap();
    let mut from_file = args(None);
    from_file.redis_url_file = Some(path.clone());
    let config = from_file.resolve().unwrap().unwrap();
    assert_eq!(
        config.redis.to_string(),
        "Redis at redis://u@10.0.0.1:6379/1"
    );

    std::fs::write(&path, "  \n").unwrap();
    assert!(matches!(
        from_file.resolve(),
        Err(ClusterError::EmptyUrlFile { .. })
    ));
}

#[test]
fn the_node_defaults_to_the_hostname() {
    let mut unnamed = args(Some("redis://127.0.0.1"));
    unnamed.node_name = None;
    let config = unnamed.resolve().unwrap().unwrap();
    assert_eq!(Some(config.node), hostname());
}

#[test]
fn a_cluster_or_sentinels_are_named_instead() {
    let mut cluster = args(None);
    cluster.redis_cluster = Some("redis://u:pw1@10.0.0.1:7000, redis://u:pw1@10.0.0.2:7000".into());
    let config = cluster.resolve().unwrap().unwrap();
    assert!(matches!(&config.redis, RedisTopology::Cluster(seeds) if seeds.len() == 2));
    assert_eq!(
        config.redis.to_string(),
        "Redis Cluster at redis://u@10.0.0.1:7000/0,redis://u@10.0.0.2:7000/0"
    );
    assert_eq!(config.redis.scrub("auth pw1 failed"), "auth *** failed");
    cluster.redis_cluster = Some("redis://10.0.0.1:7000/2".into());
    assert!(matches!(
        cluster.resolve(),
        Err(ClusterError::ClusterDatabase)
    ));

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sentinels");
    std::fs::write(&path, "rediss://:pw2@s1:26379\nrediss://:pw2@s2:26379\n").unwrap();
    let mut sentinel = args(None);
    sentinel.redis_sentinel_file = Some(path);
    assert!(matches!(
        sentinel.resolve(),
        Err(ClusterError::NoSentinelMaster)
    ));
    sentinel.redis_sentinel_master = Some("observer".into());
    let config = sentinel.resolve().unwrap().unwrap();
    assert_eq!(
        config.redis.to_string(),
        "Redis primary observer of sentinels rediss://s1:26379/0,rediss://s2:26379/0"
    );

    let mut both = args(Some("redis://127.0.0.1"));
    both.redis_cluster = Some("redis://127.0.0.1:7000".into());
    let error = both.resolve().unwrap_err().to_string();
    assert_eq!(
        error,
        "--redis-url and --redis-cluster both name a Redis: give one"
    );
    let mut stray = args(Some("redis://127.0.0.1"));
    stray.redis_sentinel_master = Some("observer".into());
    assert!(matches!(
        stray.resolve(),
        Err(ClusterError::MasterWithoutSentinel)
    ));
}

#[test]
fn a_bad_url_in_a_list_is_not_echoed() {
    let error = RedisUrl::parse_list("redis://:pw@a:1,http://:pw@b:2")
        .unwrap_err()
        .to_string();
    assert!(!error.contains("pw"), "{error}");
    assert!(RedisUrl::parse_list(" , ").is_err());
}
