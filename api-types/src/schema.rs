//! Hand-written schemas for the request bodies whose Rust shape is looser than the wire
//! contract: one struct of optional fields on the Rust side (so the server can name the
//! field at fault in its own words), a tagged union in the document (so a client, or a
//! fuzzer, knows which fields each variant requires).

use std::borrow::Cow;

use utoipa::openapi::schema::{
    AdditionalProperties, AllOfBuilder, AnyOfBuilder, ArrayBuilder, Discriminator, ObjectBuilder,
    OneOfBuilder, Schema, SchemaType, Type,
};
use utoipa::openapi::{Ref, RefOr};
use utoipa::{PartialSchema, ToSchema};

/// Text PostgreSQL can store: no NUL character. Every string the API takes refuses NUL.
pub const NO_NUL: &str = "^[^\\u0000]*$";
/// An absolute path on a Unix host, without NUL.
pub const ABSOLUTE_PATH: &str = "^/[^\\u0000]*$";
/// Text with something other than white space in it, and no NUL.
pub const NOT_BLANK: &str = "^[^\\u0000]*[^\\s\\u0000][^\\u0000]*$";

/// An environment variable's name (`is_env_name` on the server): a letter or `_`, then
/// letters, digits and `_`.
pub const ENV_NAME: &str = "^[A-Za-z_][A-Za-z0-9_]*$";
/// An HTTP header name: one or more token characters (RFC 9110), as the `http` crate's
/// `HeaderName` takes them.
pub const HEADER_NAME: &str = "^[!#$%&'*+.^_`|~0-9A-Za-z-]+$";
/// Longest `keychain:` name of a secret reference (characters).
pub const MAX_KEYCHAIN_NAME: usize = 200;
/// A secret reference, as the server's `SecretRef::parse` reads one: `env:NAME` (an
/// environment name), `file:/absolute/path` or `keychain:NAME` (1 to
/// [`MAX_KEYCHAIN_NAME`] characters), without NUL. Whether the operator's secret policy
/// allows it is configuration, which no schema states.
pub const SECRET_REF: &str =
    "^(env:[A-Za-z_][A-Za-z0-9_]*|file:/[^\\u0000]*|keychain:[^\\u0000]{1,200})$";
/// Text without control characters (Unicode `Cc`, as Rust's `char::is_control`).
pub const NO_CONTROL: &str = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$";

/// An `http://` or `https://` URL pattern: a host name whose last label starts with a
/// letter (so the URL parser reads no IP address into it, nor punycode: no `--`) or an
/// IPv4 address, an optional port, then `$tail`. IPv6 literals are not stated.
macro_rules! http_url {
    ($tail:literal) => {
        concat!(
            "^https?://(([A-Za-z0-9]+(-[A-Za-z0-9]+)*\\.)*[A-Za-z][A-Za-z0-9]*(-[A-Za-z0-9]+)*",
            "|((25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])\\.){3}",
            "(25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9]))",
            "(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[0-9]{1,4}))?",
            $tail,
            "$"
        )
    };
}

/// An http(s) URL without credentials or fragment: a path and a query may follow.
pub const HTTP_URL: &str = http_url!("([/?][^\\s\\u0000#]*)?");
/// An http(s) URL without credentials, query or fragment: a base URL paths are appended
/// to.
pub const HTTP_BASE_URL: &str = http_url!("(/[^\\s\\u0000?#]*)?");

/// A secret reference field (see [`SECRET_REF`]).
pub fn secret_ref(nullable: bool) -> ObjectBuilder {
    string(nullable, SECRET_REF, None)
}

/// An object whose keys match `key_pattern` and whose values are `value`, at most
/// `max_properties` of them, or null when `nullable`.
pub fn string_map(
    nullable: bool,
    key_pattern: &str,
    value: impl Into<Schema>,
    max_properties: Option<usize>,
) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(of(Type::Object, nullable))
        .property_names(Some(string(false, key_pattern, None)))
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::T(value.into()))))
        .max_properties(max_properties)
}

/// A rule on a whole object, as JSON Schema states an implication ("if A then B"): an
/// `anyOf` of the ways to satisfy it, each a fragment naming only the properties it
/// constrains (`unless` A holds, or B holds).
pub fn rule(description: &str, ways: Vec<ObjectBuilder>) -> RefOr<Schema> {
    ways.into_iter()
        .fold(
            AnyOfBuilder::new().description(Some(description)),
            |any, way| any.item(way),
        )
        .into()
}

/// A fragment for [`rule`]: `property` is absent or one of `values` (`null` included when
/// listed as `None`).
pub fn when_absent_or(property: &str, values: &[Option<&str>]) -> ObjectBuilder {
    let values = values
        .iter()
        .map(|v| v.map_or(serde_json::Value::Null, serde_json::Value::from));
    ObjectBuilder::new().property(property, ObjectBuilder::new().enum_values(Some(values)))
}

/// A fragment for [`rule`]: `property` is present and not null, of `kind`.
pub fn when_given(property: &str, kind: Type) -> ObjectBuilder {
    ObjectBuilder::new()
        .property(property, ObjectBuilder::new().schema_type(kind))
        .required(property)
}

/// A fragment for [`rule`]: each of `properties` is absent or null.
pub fn when_null(properties: &[&str]) -> ObjectBuilder {
    properties
        .iter()
        .fold(ObjectBuilder::new(), |object, name| {
            object.property(*name, ObjectBuilder::new().schema_type(Type::Null))
        })
}

/// A string field: `nullable` when the server reads `null` as absent.
pub fn string(nullable: bool, pattern: &str, max_length: Option<usize>) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(of(Type::String, nullable))
        .pattern(Some(pattern))
        .max_length(max_length)
}

pub fn integer(nullable: bool, minimum: i64, maximum: i64) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(of(Type::Integer, nullable))
        .minimum(Some(minimum))
        .maximum(Some(maximum))
}

pub fn boolean(nullable: bool) -> ObjectBuilder {
    ObjectBuilder::new().schema_type(of(Type::Boolean, nullable))
}

/// One of `values`, or null when `nullable`.
pub fn one_of_strings(nullable: bool, values: &[&str]) -> ObjectBuilder {
    let values = values.iter().map(|v| serde_json::Value::from(*v));
    let null = nullable.then_some(serde_json::Value::Null);
    ObjectBuilder::new()
        .schema_type(of(Type::String, nullable))
        .enum_values(Some(values.chain(null)))
}

/// A list of distinct names, or null.
pub fn names(description: &str) -> RefOr<Schema> {
    ArrayBuilder::new()
        .schema_type(of(Type::Array, true))
        .items(string(false, NOT_BLANK, None))
        .unique_items(true)
        .description(Some(description))
        .into()
}

fn of(kind: Type, nullable: bool) -> SchemaType {
    if nullable {
        SchemaType::from_iter([kind, Type::Null])
    } else {
        SchemaType::new(kind)
    }
}

/// A field of a variant: its name, whether the variant requires it, and its schema.
pub type Field = (&'static str, bool, RefOr<Schema>);

/// One variant of a tagged union: the tag's value, the component it is named as, and its
/// fields beside the tag.
pub struct Variant {
    pub tag: &'static str,
    pub name: &'static str,
    pub description: &'static str,
    pub fields: Vec<Field>,
    /// Rules across fields (see [`rule`]): the component is then the `allOf` of the closed
    /// object and these.
    pub rules: Vec<RefOr<Schema>>,
}

/// A closed object per variant (unknown fields are refused), registered as components,
/// and a `oneOf` over them with a discriminator on `tag`.
pub fn tagged_union(
    tag: &'static str,
    description: &str,
    variants: Vec<Variant>,
    schemas: &mut Vec<(String, RefOr<Schema>)>,
) -> RefOr<Schema> {
    let mut union = OneOfBuilder::new().description(Some(description));
    let mut discriminator = Discriminator::new(tag);
    for variant in variants {
        let reference = format!("#/components/schemas/{}", variant.name);
        discriminator
            .mapping
            .insert(variant.tag.to_string(), reference.clone());
        let tag_schema = one_of_strings(false, &[variant.tag]);
        let object = variant.fields.into_iter().fold(
            ObjectBuilder::new()
                .schema_type(Type::Object)
                .description(Some(variant.description))
                .property(tag, tag_schema)
                .required(tag)
                .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(false))),
            |object, (name, required, schema)| {
                let object = object.property(name, schema);
                if required {
                    object.required(name)
                } else {
                    object
                }
            },
        );
        let component = if variant.rules.is_empty() {
            object.into()
        } else {
            variant
                .rules
                .into_iter()
                .fold(AllOfBuilder::new().item(object), |all, rule| all.item(rule))
                .into()
        };
        schemas.push((variant.name.to_string(), component));
        union = union.item(Ref::new(reference));
    }
    union.discriminator(Some(discriminator)).into()
}

/// Largest magnitude a number in free-form JSON may have: 2^53 - 1, the range every JSON
/// reader holds exactly (the server refuses larger ones with 422).
pub const MAX_JSON_NUMBER: i64 = 9_007_199_254_740_991;

/// The schema of free-form JSON a request carries (a media job's `input`, a preset's
/// `compat`): any object whose values are [`JsonValue`]s. Only a schema; the Rust fields
/// stay `serde_json` values, checked by the server's `check_free_json`.
pub struct JsonObject;

impl PartialSchema for JsonObject {
    fn schema() -> RefOr<Schema> {
        json_object(false)
            .description(Some(
                "Any JSON object whose strings and keys hold no NUL and whose numbers are \
                 within ±(2^53 - 1), the range every JSON reader holds exactly (422 \
                 otherwise), at any depth; the schema states it for the object's own values \
                 (`JsonValue`), the server checks deeper ones too.",
            ))
            .into()
    }
}

impl ToSchema for JsonObject {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("JsonObject")
    }

    fn schemas(schemas: &mut Vec<(String, RefOr<Schema>)>) {
        schemas.push((JsonValue::name().into_owned(), JsonValue::schema()));
    }
}

/// An object of [`JsonValue`]s, keys without NUL.
fn json_object(nullable: bool) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(of(Type::Object, nullable))
        .property_names(Some(string(false, NO_NUL, None)))
        .additional_properties(Some(AdditionalProperties::RefOr(RefOr::Ref(
            Ref::from_schema_name(JsonValue::name()),
        ))))
}

/// A value of free-form JSON: a string without NUL, a number within ±[`MAX_JSON_NUMBER`],
/// a boolean, null, or an array or object (whose own values the server checks: see below).
pub struct JsonValue;

impl PartialSchema for JsonValue {
    fn schema() -> RefOr<Schema> {
        let number = ObjectBuilder::new()
            .schema_type(Type::Number)
            .minimum(Some(-MAX_JSON_NUMBER))
            .maximum(Some(MAX_JSON_NUMBER));
        // One level deep: a recursive union is more than common generators (the Python
        // client's) can read; deeper numbers are the server's to check.
        let array = ArrayBuilder::new();
        AnyOfBuilder::new()
            .description(Some(
                "A JSON value: a string without NUL, a number within ±(2^53 - 1), a boolean, \
                 null, an array or an object (the server checks the values inside those too).",
            ))
            .item(string(false, NO_NUL, None))
            .item(number)
            .item(
                ObjectBuilder::new()
                    .schema_type(SchemaType::from_iter([Type::Boolean, Type::Null])),
            )
            .item(array)
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .additional_properties(Some(AdditionalProperties::<Schema>::FreeForm(true))),
            )
            .into()
    }
}

impl ToSchema for JsonValue {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("JsonValue")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_secret_reference_pattern_uses_the_keychain_limit() {
        assert!(SECRET_REF.contains(&format!("{{1,{MAX_KEYCHAIN_NAME}}}")));
    }

    #[test]
    fn every_listed_time_zone_parses_as_the_server_parses_it() {
        use std::str::FromStr;
        let zones: Vec<&str> = crate::time_zones().collect();
        assert!(zones.contains(&"UTC") && zones.contains(&"Europe/Madrid"));
        for zone in zones {
            assert!(chrono_tz::Tz::from_str(zone).is_ok(), "{zone}");
        }
    }
}
