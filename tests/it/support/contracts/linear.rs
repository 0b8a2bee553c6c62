//! Linear's contract: the part of its GraphQL schema Keel's requests reach, as npm
//! `@linear/sdk` generates it (written to tests/fixtures/contracts/linear-graphql.json by
//! `scripts/linear-contract`). A request a Linear stand-in received conforms when its body
//! is one operation whose every selected field is a field of its type, with arguments the
//! field takes, literal and variable values of their types, and a selection exactly where
//! the field's type is an object; and when the variables sent are the ones declared, with
//! values of their declared types.

use std::collections::HashMap;

use graphql_parser::query::{
    Definition, Document, OperationDefinition, Selection, SelectionSet, Value as Literal,
};
use serde_json::{Map, Value};
use wiremock::Request;

const LINEAR_GRAPHQL: &str = include_str!("../../../fixtures/contracts/linear-graphql.json");

type Checked = Result<(), String>;

/// Panics, naming the request and why, unless every one conforms to Linear's schema.
pub fn assert_linear_conforms(requests: &[Request]) {
    let schema = Schema::load();
    for request in requests {
        if let Err(why) = schema.conforms(&request.body) {
            let body = String::from_utf8_lossy(&request.body);
            panic!("{body} is not a request Linear's schema takes: {why}");
        }
    }
}

struct Schema {
    described: Value,
}

/// The variables an operation declares, by name: their GraphQL type, and whether they
/// have a default.
type Declared = HashMap<String, (String, bool)>;

impl Schema {
    fn load() -> Self {
        Self {
            described: serde_json::from_str(LINEAR_GRAPHQL).unwrap(),
        }
    }

    fn conforms(&self, body: &[u8]) -> Checked {
        let body: Value = serde_json::from_slice(body).map_err(|e| format!("not JSON: {e}"))?;
        let text = body["query"].as_str().ok_or("no query")?;
        let document: Document<String> =
            graphql_parser::parse_query(text).map_err(|e| format!("not GraphQL: {e}"))?;
        let [Definition::Operation(operation)] = document.definitions.as_slice() else {
            return Err("not exactly one operation".into());
        };
        let (root, definitions, selection) = match operation {
            OperationDefinition::Query(q) => ("Query", &q.variable_definitions, &q.selection_set),
            OperationDefinition::Mutation(m) => {
                ("Mutation", &m.variable_definitions, &m.selection_set)
            }
            _ => return Err("neither a query nor a mutation".into()),
        };
        let declared: Declared = definitions
            .iter()
            .map(|d| {
                let given = (d.var_type.to_string(), d.default_value.is_some());
                (d.name.clone(), given)
            })
            .collect();
        self.variables(&declared, &body["variables"])?;
        self.selection(root, selection, &declared)
    }

    /// The variables sent are the ones declared, of their types.
    fn variables(&self, declared: &Declared, sent: &Value) -> Checked {
        let empty = Map::new();
        let sent = match sent {
            Value::Null => &empty,
            Value::Object(sent) => sent,
            other => return Err(format!("variables {other} are not an object")),
        };
        if let Some(name) = sent.keys().find(|name| !declared.contains_key(*name)) {
            return Err(format!("variable ${name} is not declared"));
        }
        for (name, (ty, defaulted)) in declared {
            self.known(ty)?;
            match sent.get(name) {
                None if ty.ends_with('!') && !defaulted => {
                    return Err(format!("required variable ${name} is not sent"));
                }
                None => {}
                Some(value) => self
                    .json(ty, value)
                    .map_err(|why| format!("variable ${name}: {why}"))?,
            }
        }
        Ok(())
    }

    /// Every field selected on `owner` is one of its fields, with its arguments.
    fn selection(&self, owner: &str, set: &SelectionSet<String>, vars: &Declared) -> Checked {
        for item in &set.items {
            let Selection::Field(field) = item else {
                return Err("fragments are not checked (Keel sends none)".into());
            };
            if field.name == "__typename" {
                continue;
            }
            let ty = self
                .field(owner, &field.name)
                .ok_or_else(|| format!("{owner} has no field {}", field.name))?;
            self.arguments(owner, &field.name, &field.arguments, vars)?;
            let named = named(ty);
            match (
                self.fields(named).is_some(),
                field.selection_set.items.is_empty(),
            ) {
                (true, true) => return Err(format!("{owner}.{} selects nothing", field.name)),
                (false, false) => return Err(format!("{owner}.{} is a leaf", field.name)),
                (true, false) => self.selection(named, &field.selection_set, vars)?,
                (false, true) => {}
            }
        }
        Ok(())
    }

    /// The arguments given are the field's (`<Owner><Field>Args`), of their types, and
    /// every required one is given.
    fn arguments(
        &self,
        owner: &str,
        field: &str,
        given: &[(String, Literal<String>)],
        vars: &Declared,
    ) -> Checked {
        let name = format!("{owner}{}{}Args", field[..1].to_uppercase(), &field[1..]);
        let empty = Map::new();
        let takes = self.fields(&name).unwrap_or(&empty);
        for (argument, value) in given {
            let ty = takes
                .get(argument)
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{owner}.{field} takes no argument {argument}"))?;
            self.literal(ty, value, vars)
                .map_err(|why| format!("{owner}.{field}({argument}): {why}"))?;
        }
        required(takes, given.iter().map(|(name, _)| name.as_str()))
            .map_err(|missing| format!("{owner}.{field} needs argument {missing}"))
    }

    /// A value written in the document, for a place of type `ty`.
    fn literal(&self, ty: &str, value: &Literal<String>, vars: &Declared) -> Checked {
        if let Literal::Variable(name) = value {
            let (declared, defaulted) = vars
                .get(name)
                .ok_or_else(|| format!("${name} is not declared"))?;
            return match fits(declared, ty) || (*defaulted && fits(&format!("{declared}!"), ty)) {
                true => Ok(()),
                false => Err(format!("${name} is {declared}, where {ty} goes")),
            };
        }
        let Some(inner) = ty.strip_suffix('!') else {
            return match value {
                Literal::Null => Ok(()),
                _ => self.literal(&format!("{ty}!"), value, vars),
            };
        };
        match (value, list_of(inner)) {
            (Literal::List(items), Some(item)) => {
                items.iter().try_for_each(|v| self.literal(item, v, vars))
            }
            // A single value where a list goes is a list of one (input coercion).
            (_, Some(item)) => self.literal(item, value, vars),
            (Literal::Object(fields), None) => {
                self.object(ty, fields, |field_ty, v| self.literal(field_ty, v, vars))
            }
            (Literal::Enum(member), None) => self.member(inner, member),
            (scalar, None) => scalar_fits(inner, &literal_kind(scalar)),
        }
    }

    /// A variable's value as sent, for its declared type `ty`.
    fn json(&self, ty: &str, value: &Value) -> Checked {
        let Some(inner) = ty.strip_suffix('!') else {
            return match value {
                Value::Null => Ok(()),
                _ => self.json(&format!("{ty}!"), value),
            };
        };
        match (value, list_of(inner)) {
            (Value::Null, _) => Err(format!("null, where {ty} goes")),
            (Value::Array(items), Some(item)) => items.iter().try_for_each(|v| self.json(item, v)),
            (_, Some(item)) => self.json(item, value),
            (Value::Object(fields), None) => {
                self.object(ty, fields, |field_ty, v| self.json(field_ty, v))
            }
            (Value::String(member), None) if self.enum_members(inner).is_some() => {
                self.member(inner, member)
            }
            (scalar, None) => scalar_fits(inner, &json_kind(scalar)),
        }
    }

    /// An input object's `fields` for the non-null type `ty`: each a field of its type,
    /// its value as `check` finds it for the field's type, and every required one given.
    fn object<'v, V: 'v>(
        &self,
        ty: &str,
        fields: impl IntoIterator<Item = (&'v String, &'v V)>,
        check: impl Fn(&str, &'v V) -> Checked,
    ) -> Checked {
        let inner = named(ty);
        let takes = self
            .fields(inner)
            .ok_or_else(|| format!("an object, where {ty} goes"))?;
        let mut given = Vec::new();
        for (name, v) in fields {
            let field_ty = takes
                .get(name)
                .and_then(Value::as_str)
                .ok_or_else(|| format!("{inner} has no field {name}"))?;
            check(field_ty, v).map_err(|why| format!("{inner}.{name}: {why}"))?;
            given.push(name.as_str());
        }
        required(takes, given.into_iter()).map_err(|missing| format!("{inner} needs {missing}"))
    }

    fn known(&self, ty: &str) -> Checked {
        let named = named(ty);
        let is_scalar = self.described["scalars"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s == named);
        match is_scalar || self.fields(named).is_some() || self.enum_members(named).is_some() {
            true => Ok(()),
            false => Err(format!("no type {named}")),
        }
    }

    fn member(&self, enumeration: &str, member: &str) -> Checked {
        let members = self
            .enum_members(enumeration)
            .ok_or_else(|| format!("{member}, where {enumeration} goes"))?;
        match members.iter().any(|m| m == member) {
            true => Ok(()),
            false => Err(format!("{enumeration} has no member {member}")),
        }
    }

    fn field(&self, owner: &str, field: &str) -> Option<&str> {
        self.fields(owner)?.get(field)?.as_str()
    }

    fn fields(&self, name: &str) -> Option<&Map<String, Value>> {
        self.described["types"][name].as_object()
    }

    fn enum_members(&self, name: &str) -> Option<&Vec<Value>> {
        self.described["enums"][name].as_array()
    }
}

/// `[ID!]`'s item type, `ID!`; `None` for a type that is not a list.
fn list_of(ty: &str) -> Option<&str> {
    ty.strip_prefix('[')?.strip_suffix(']')
}

/// The named type under the list and non-null marks: `[ID!]!` is of `ID`.
fn named(ty: &str) -> &str {
    ty.trim_matches(|c| matches!(c, '[' | ']' | '!'))
}

/// Whether a variable of type `declared` may go where `expected` goes (GraphQL's
/// "are types compatible"): as strict or stricter about nulls, lists for lists.
fn fits(declared: &str, expected: &str) -> bool {
    match (declared.strip_suffix('!'), expected.strip_suffix('!')) {
        (Some(d), Some(e)) => fits(d, e),
        (None, Some(_)) => false,
        (Some(d), None) => fits(d, expected),
        (None, None) => match (list_of(declared), list_of(expected)) {
            (Some(d), Some(e)) => fits(d, e),
            (None, None) => declared == expected,
            _ => false,
        },
    }
}

/// Every non-null field of `takes` is among `given`, or the name of the first that is not.
fn required<'a>(takes: &Map<String, Value>, given: impl Iterator<Item = &'a str>) -> Checked {
    let given: Vec<&str> = given.collect();
    let missing = takes.iter().find(|(name, ty)| {
        ty.as_str().is_some_and(|t| t.ends_with('!')) && !given.contains(&name.as_str())
    });
    match missing {
        Some((name, _)) => Err(name.clone()),
        None => Ok(()),
    }
}

/// What a written scalar is: `Int`, `Float`, `String` or `Boolean`.
fn literal_kind(value: &Literal<String>) -> String {
    match value {
        Literal::Int(_) => "Int",
        Literal::Float(_) => "Float",
        Literal::String(_) => "String",
        Literal::Boolean(_) => "Boolean",
        _ => "something else",
    }
    .into()
}

fn json_kind(value: &Value) -> String {
    match value {
        Value::Number(n) if n.is_i64() || n.is_u64() => "Int",
        Value::Number(_) => "Float",
        Value::String(_) => "String",
        Value::Bool(_) => "Boolean",
        _ => "something else",
    }
    .into()
}

/// Whether a scalar of `kind` is a value of the scalar type `ty`. Linear's own scalars
/// (`DateTime`, `JSON`, …) are written as strings.
fn scalar_fits(ty: &str, kind: &str) -> Checked {
    let takes: &[&str] = match ty {
        "Int" => &["Int"],
        "Float" => &["Int", "Float"],
        "Boolean" => &["Boolean"],
        "ID" => &["String", "Int"],
        "String" => &["String"],
        _ => &["String", "Int", "Float", "Boolean"],
    };
    match takes.contains(&kind) {
        true => Ok(()),
        false => Err(format!("a {kind}, where {ty} goes")),
    }
}

#[test]
fn a_document_outside_the_schema_does_not_conform() {
    let schema = Schema::load();
    let check = |query: &str, variables: Value| {
        schema.conforms(
            json!({ "query": query, "variables": variables })
                .to_string()
                .as_bytes(),
        )
    };
    use serde_json::json;
    let issues = "query Q($ids: [ID!]!, $first: Int!) {
        issues(first: $first, filter: { id: { in: $ids } }) { nodes { id identifier } } }";
    assert_eq!(check(issues, json!({ "ids": ["a"], "first": 5 })), Ok(()));
    // A field Issue does not have; a leaf given a selection; an object with none.
    let unknown = issues.replace("identifier", "headline");
    assert!(check(&unknown, json!({ "ids": [], "first": 5 })).is_err());
    let leaf = issues.replace("identifier", "identifier { id }");
    assert!(check(&leaf, json!({ "ids": [], "first": 5 })).is_err());
    let bare = issues.replace("nodes { id identifier }", "nodes");
    assert!(check(&bare, json!({ "ids": [], "first": 5 })).is_err());
    // A variable of the wrong type; a nullable one where a non-null goes; a filter field
    // Linear does not have; a value of the wrong type; an undeclared variable sent.
    assert!(check(issues, json!({ "ids": [1.5], "first": 5 })).is_err());
    assert!(check(issues, json!({ "ids": ["a"], "first": "5" })).is_err());
    let nullable = "mutation M($issueId: String, $body: String!) {
        commentCreate(input: { issueId: $issueId, body: $body }) { success } }";
    let comment = nullable.replace("$issueId: String,", "$issueId: String!,");
    assert_eq!(
        check(&comment, json!({ "issueId": "i", "body": "b" })),
        Ok(())
    );
    assert!(check(nullable, json!({ "issueId": "i", "body": "b" })).is_ok());
    let strict = comment.replace("{ success }", "{ success comment { id } }");
    assert_eq!(
        check(&strict, json!({ "issueId": "i", "body": "b" })),
        Ok(())
    );
    let filter = issues.replace("id: { in: $ids }", "identifierish: { in: $ids }");
    assert!(check(&filter, json!({ "ids": [], "first": 5 })).is_err());
    let first = issues.replace("first: $first", "first: \"five\"");
    assert!(check(&first, json!({ "ids": [], "first": 5 })).is_err());
    assert!(check(issues, json!({ "ids": [], "first": 5, "extra": 1 })).is_err());
    // A required argument left out.
    assert!(check("query { issue { id } }", json!({})).is_err());
}
