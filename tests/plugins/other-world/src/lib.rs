//! A valid component for some other world: the host must reject it as not
//! implementing `sluice:plugin/transform`.

wit_bindgen::generate!({
    inline: "
        package test:other;
        world other {
            export hello: func() -> string;
        }
    ",
    world: "test:other/other",
});

struct Other;

impl Guest for Other {
    fn hello() -> String {
        "hello".to_string()
    }
}

export!(Other);
