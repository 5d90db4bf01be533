use super::*;

#[test]
fn one_copy_per_text_within_the_bounds() {
    let mut texts = SharedTexts::default();
    let first = texts.share("gateway-0.gateway:88");
    assert!(Arc::ptr_eq(&first, &texts.share("gateway-0.gateway:88")));
    assert!(!Arc::ptr_eq(&first, &texts.share("gateway-1.gateway:88")));

    let long = "x".repeat(MAX_TEXT_BYTES + 1);
    assert!(!Arc::ptr_eq(&texts.share(&long), &texts.share(&long)));
    assert_eq!(*texts.share(&long), *long, "not held, still the text");

    for index in 0..2 * MAX_TEXTS {
        texts.share(&format!("member-{index}"));
    }
    assert_eq!(texts.texts.len(), MAX_TEXTS);
    assert!(Arc::ptr_eq(&first, &texts.share("gateway-0.gateway:88")));
    let past_the_bound = texts.share("one more");
    assert_eq!(&*past_the_bound, "one more");
    assert!(!Arc::ptr_eq(&past_the_bound, &texts.share("one more")));
}
