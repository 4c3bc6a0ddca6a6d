//! Scratch: clean start and SIGTERM.
use std::time::Duration;

use delivery_harness::mesh::Mesh;

#[tokio::test]
async fn clean_start_then_sigterm_releases_the_lease() {
    let mesh = Mesh::builder()
        .space("demo")
        .unwrap()
        .start()
        .await
        .unwrap();
    let space = mesh.space().clone();
    let mut d = mesh.deliver(&space).spawn().unwrap();
    d.wait_for_line("delivery daemon up", Duration::from_secs(20))
        .await
        .unwrap();
    let insp = mesh.inspector(&space).await.unwrap();
    let row = insp.lease().await.unwrap().unwrap();
    println!("row: {row:?}");
    d.terminate().unwrap();
    let st = d.wait_exit(Duration::from_secs(15)).await.unwrap();
    println!("{}", d.transcript());
    println!("exit: {st:?}");
    assert!(insp.lease().await.unwrap().is_none());
}
