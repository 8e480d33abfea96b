//! Native cost of the wire floor: canonicalize + verify of a 1.5 KB envelope.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use rand::SeedableRng;
use relay_core::client::{draft, random_id, seal, AccountKey, DeviceKey};
use relay_core::wire::canonical;
use relay_core::wire::certificate::DeviceCertificate;
use relay_core::wire::envelope::MessageEnvelope;
use relay_core::wire::json;
use relay_core::wire::signature::{verify_strict, SignedObject};

fn envelope_of_about_1500_bytes() -> (Vec<u8>, DeviceCertificate) {
    let mut rng = rand_chacha::ChaCha20Rng::seed_from_u64(42);
    let alice = AccountKey::generate(&mut rng);
    let phone = DeviceKey::generate(&mut rng);
    let bob = AccountKey::generate(&mut rng);
    let key = seal::message_key(&mut rng);
    let body = seal::seal_body(&mut rng, &key, &[b'x'; 900]);
    let cert = draft::certificate("dev", &alice, &phone, &["send"], 1).sign(&alice);
    let env = draft::envelope(
        "dev",
        &random_id(&mut rng),
        &alice.id(),
        &phone.id(),
        &bob.id(),
        2,
        body,
    )
    .sign(&phone);
    let bytes = canonical::object_to_vec(&env);
    (bytes, DeviceCertificate::parse(cert).unwrap())
}

fn bench(c: &mut Criterion) {
    let (bytes, cert) = envelope_of_about_1500_bytes();
    eprintln!("envelope: {} bytes", bytes.len());
    let mut g = c.benchmark_group("envelope_1.5KB");
    g.throughput(Throughput::Elements(1));
    g.bench_function("parse+canonicalize+verify", |b| {
        b.iter(|| {
            let env =
                MessageEnvelope::parse(json::parse_object(black_box(&bytes)).unwrap()).unwrap();
            env.verify_with(&cert).unwrap();
        })
    });
    let env = MessageEnvelope::parse(json::parse_object(&bytes).unwrap()).unwrap();
    g.bench_function("parse", |b| {
        b.iter(|| json::parse_object(black_box(&bytes)).unwrap())
    });
    g.bench_function("canonicalize", |b| {
        b.iter(|| black_box(env.signing_input()))
    });
    let input = env.signing_input();
    g.bench_function("verify_strict", |b| {
        b.iter(|| verify_strict(&cert.device_key, black_box(&input), env.sig()).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
